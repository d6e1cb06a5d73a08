#include "piper/cost/task_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "piper/spec/counting.h"

namespace piper::cost {

namespace {

// The profiles named like `model` at `seq`; *same_size says whether one of them has its parameter count.
const Calibration::TaskProfile* match(const Calibration& c, const ModelSpec& model, int64_t seq, bool* renamed) {
  const int64_t params = count_params(model).total();
  *renamed = false;
  for (const Calibration::TaskProfile& p : c.task_profiles) {
    if (p.model != model.name || p.seq != seq) continue;
    if (p.parameters == params) return &p;
    *renamed = true;
  }
  return nullptr;
}

size_t points_at(const Calibration::TaskProfile& p, int threads) {
  return static_cast<size_t>(std::count_if(p.points.begin(), p.points.end(),
                                           [&](const Calibration::TaskProfilePoint& q) { return q.threads == threads; }));
}

std::optional<double> interpolate(const std::vector<std::pair<double, double>>& curve, double tokens) {
  if (curve.empty()) return std::nullopt;
  const double x = std::log(std::max(tokens, 1.0));
  if (x <= curve.front().first) return curve.front().second;
  if (x >= curve.back().first) return curve.back().second;
  size_t i = 1;
  while (curve[i].first < x) ++i;
  const double u = (x - curve[i - 1].first) / (curve[i].first - curve[i - 1].first);
  return curve[i - 1].second + u * (curve[i].second - curve[i - 1].second);
}

}  // namespace

TaskScales::TaskScales() {
  for (auto& k : chunk) k = {1.0, 1.0, 1.0};
}

double TaskScales::of(Part part, int k) const {
  const Part owner = is_chunk(part) ? part : Part::kAttention;
  return chunk[static_cast<size_t>(owner)][static_cast<size_t>(k)];
}

TaskProfileTable TaskProfileTable::find(const Calibration& c, const ModelSpec& model, int64_t seq) {
  TaskProfileTable t;
  if (c.task_profiles.empty() || c.rank_threads < 1) return t;
  bool renamed = false;
  const Calibration::TaskProfile* p = match(c, model, seq, &renamed);
  if (p == nullptr || points_at(*p, c.rank_threads) == 0) return t;
  t.applies_ = true;
  for (const Calibration::TaskProfilePoint& q : p->points) {
    if (q.threads != c.rank_threads) continue;
    const std::pair<double, double> point{std::log(q.tokens), q.scale()};
    const std::optional<Calibration::TaskKey> key = Calibration::parse_task_key(q.task);
    if (!key) {  // "update": every other key was checked when the file was read
      t.update_.push_back(point);
      continue;
    }
    t.chunk_[static_cast<size_t>(key->part)][static_cast<size_t>(key->pass)].push_back(point);
  }
  for (auto& passes : t.chunk_) {
    for (Curve& curve : passes) std::sort(curve.begin(), curve.end());
  }
  std::sort(t.update_.begin(), t.update_.end());
  return t;
}

bool apply_model_sharing(Calibration* c, const ModelSpec& model, int64_t seq) {
  bool renamed = false;
  const Calibration::TaskProfile* p = match(*c, model, seq, &renamed);
  if (p == nullptr || p->sharing.empty()) return false;
  c->core_sharing = p->sharing;
  return true;
}

TaskScales TaskProfileTable::at(double tokens) const {
  TaskScales s;
  if (!applies_) return s;
  for (Part part : kChunkParts) {
    const auto& curves = chunk_[static_cast<size_t>(part)];
    const std::optional<double> bw = interpolate(curves[kBW], tokens);
    for (int k = 0; k < 3; ++k) {
      std::optional<double> r = interpolate(curves[static_cast<size_t>(k)], tokens);
      if (!r && k > 0) r = bw;
      if (r) s.chunk[static_cast<size_t>(part)][static_cast<size_t>(k)] = *r;
    }
  }
  s.update = interpolate(update_, tokens).value_or(1.0);
  return s;
}

std::string task_profile_note(const Calibration& c, const ModelSpec& model, int64_t seq) {
  if (c.task_profiles.empty()) return "";
  bool renamed = false;
  const Calibration::TaskProfile* p = match(c, model, seq, &renamed);
  if (p == nullptr && renamed) {
    return "task prices unscaled (the calibration's task profile of '" + model.name + "' at seq " +
           std::to_string(seq) + " is of a model with another parameter count: an edited config; " +
           "`piper calibrate --model <its config file> --seq " + std::to_string(seq) + "` measures this one)";
  }
  if (p == nullptr) {
    return "task prices unscaled (the calibration has no task profile of " + model.name + " at seq " +
           std::to_string(seq) + "; `piper calibrate --model " + model.name + " --seq " + std::to_string(seq) +
           "` measures one)";
  }
  if (c.rank_threads < 1) {
    return "task prices unscaled (the task profile of " + model.name +
           " applies to runs priced per thread count: piper train, plan --local-ranks)";
  }
  const size_t n = points_at(*p, c.rank_threads);
  if (n == 0) {
    return "task prices unscaled (the task profile of " + model.name + " has no points at " +
           std::to_string(c.rank_threads) + " thread(s))";
  }
  std::string own;
  if (!p->sharing.empty() && p->sharing == c.core_sharing) {
    own = "; core sharing of its own steps";
    char buf[32];
    for (size_t k = 0; k < p->sharing.size(); ++k) {
      std::snprintf(buf, sizeof(buf), "%s %.2f", k == 0 ? "" : ",", p->sharing[k]);
      own += buf;
    }
    own += " at 2.." + std::to_string(p->sharing.size() + 1) + " ranks";
  }
  return "task prices scaled by the measured task profile of " + model.name + " (seq " + std::to_string(seq) + ", " +
         std::to_string(c.rank_threads) + " thread" + (c.rank_threads == 1 ? "" : "s") + ", " + std::to_string(n) +
         " points" + own + ")";
}

}  // namespace piper::cost
