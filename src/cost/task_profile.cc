#include "piper/cost/task_profile.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "piper/spec/counting.h"

namespace piper::cost {

namespace {

constexpr const char* kPassName[3] = {"F", "B", "W"};

// measured / priced of `key` at `tokens` from the points at `threads`, or nullopt-like -1 when there are none.
double interpolate(const Calibration::TaskProfile& p, int threads, const std::string& key, double tokens) {
  std::vector<std::pair<double, double>> at;  // (log tokens, ratio)
  for (const Calibration::TaskProfilePoint& q : p.points) {
    if (q.threads == threads && q.task == key) at.emplace_back(std::log(q.tokens), q.measured_s / q.priced_s);
  }
  if (at.empty()) return -1;
  std::sort(at.begin(), at.end());
  const double x = std::log(std::max(tokens, 1.0));
  if (x <= at.front().first) return at.front().second;
  if (x >= at.back().first) return at.back().second;
  size_t i = 1;
  while (at[i].first < x) ++i;
  const double u = (x - at[i - 1].first) / (at[i].first - at[i - 1].first);
  return at[i - 1].second + u * (at[i].second - at[i - 1].second);
}

bool has_threads(const Calibration::TaskProfile& p, int threads) {
  return std::any_of(p.points.begin(), p.points.end(),
                     [&](const Calibration::TaskProfilePoint& q) { return q.threads == threads; });
}

}  // namespace

TaskScales::TaskScales() {
  for (auto& k : chunk) k = {1.0, 1.0, 1.0};
}

double TaskScales::of(Part part, int k) const {
  const Part owner = is_chunk(part) ? part : Part::kAttention;
  return chunk[static_cast<size_t>(owner)][static_cast<size_t>(k)];
}

const Calibration::TaskProfile* find_task_profile(const Calibration& c, const ModelSpec& model, int64_t seq) {
  if (c.task_profiles.empty()) return nullptr;
  const int64_t params = count_params(model).total();
  for (const Calibration::TaskProfile& p : c.task_profiles) {
    if (p.model == model.name && p.parameters == params && p.seq == seq) return &p;
  }
  return nullptr;
}

TaskScales task_scales(const Calibration& c, const ModelSpec& model, int64_t seq, double tokens) {
  TaskScales s;
  const Calibration::TaskProfile* p = find_task_profile(c, model, seq);
  if (p == nullptr || c.rank_threads < 1 || !has_threads(*p, c.rank_threads)) return s;
  s.applied = true;
  for (Part part : kChunkParts) {
    const std::string chunk = chunk_name(part);
    const double bw = interpolate(*p, c.rank_threads, chunk + ".BW", tokens);
    for (int k = 0; k < 3; ++k) {
      double r = interpolate(*p, c.rank_threads, chunk + "." + kPassName[k], tokens);
      if (r < 0 && k > 0) r = bw;
      if (r > 0) s.chunk[static_cast<size_t>(part)][static_cast<size_t>(k)] = r;
    }
  }
  const double u = interpolate(*p, c.rank_threads, "update", tokens);
  if (u > 0) s.update = u;
  return s;
}

std::string task_profile_note(const Calibration& c, const ModelSpec& model, int64_t seq) {
  if (c.task_profiles.empty()) return "";
  const std::string how = "`piper calibrate --model " + model.name + " --seq " + std::to_string(seq) + "`";
  const Calibration::TaskProfile* p = find_task_profile(c, model, seq);
  if (p == nullptr) {
    return "task prices: roofline (the calibration has no task profile of " + model.name + " at seq " +
           std::to_string(seq) + "; " + how + " measures one)";
  }
  if (c.rank_threads < 1 || !has_threads(*p, c.rank_threads)) {
    return "task prices: roofline (the task profile of " + model.name + " has no points at " +
           (c.rank_threads < 1 ? std::string("this cluster's thread count") :
                                 std::to_string(c.rank_threads) + " thread(s)") + ")";
  }
  size_t n = 0;
  for (const Calibration::TaskProfilePoint& q : p->points) n += q.threads == c.rank_threads;
  return "task prices scaled by the measured task profile of " + model.name + " (seq " + std::to_string(seq) + ", " +
         std::to_string(c.rank_threads) + " thread" + (c.rank_threads == 1 ? "" : "s") + ", " + std::to_string(n) +
         " points)";
}

}  // namespace piper::cost
