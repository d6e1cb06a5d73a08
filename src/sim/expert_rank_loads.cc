#include "piper/sim/expert_rank_loads.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

namespace piper::sim {

using compile::Instruction;
using compile::OpKind;

std::unordered_map<int, ExpertsBuffer> experts_buffers(const compile::Program& prog) {
  std::unordered_map<int, ExpertsBuffer> out;
  for (const compile::Stream& st : prog.streams) {
    const auto& in = st.instrs;
    for (size_t i = 0; i < in.size(); ++i) {
      // The first alloc of a run owns the forward that follows (a second one is a recompute checkpoint); before a
      // B, the run is its working set and the gradients it leaves for W, both per routed row; before a BW, the
      // working set, then ZeRO-2/3's full gradients (per parameter).
      if (in[i].op != OpKind::kAlloc) continue;
      size_t first = i;
      while (first > 0 && in[first - 1].op == OpKind::kAlloc) --first;
      size_t j = i + 1;
      while (j < in.size() && in[j].op == OpKind::kAlloc) ++j;
      if (j < in.size() && in[j].op == OpKind::kCollective) continue;  // ZeRO-3: gathered parameters
      while (j < in.size() && in[j].op != OpKind::kCompute) ++j;
      if (j == in.size() || in[j].part != Part::kExperts) continue;
      const bool whole_run = in[j].pass == ir::Pass::kB;
      if (!whole_run && (first != i || (in[j].pass != ir::Pass::kF && in[j].pass != ir::Pass::kBW))) continue;
      out[in[i].buffer] = ExpertsBuffer{in[j].layer, in[i].mem_delta, in[j].pass != ir::Pass::kF};
    }
  }
  return out;
}

Result<RankLoadOverrides> rank_load_overrides(const compile::Program& prog,
                                              const std::vector<std::vector<double>>& template_s, int ep_rank,
                                              const ExpertRankLoads& loads) {
  RankLoadOverrides o;
  o.duration_s = template_s;
  std::map<std::pair<int, int>, double> priced;  // (layer, pass) -> seconds, for whole experts instructions
  for (size_t s = 0; s < prog.streams.size(); ++s) {
    const auto& instrs = prog.streams[s].instrs;
    for (size_t i = 0; i < instrs.size(); ++i) {
      const Instruction& in = instrs[i];
      if (in.op != OpKind::kCompute || in.part != Part::kExperts) continue;
      const double load = loads.loads.of(in.layer, ep_rank);
      const bool whole = in.segment == compile::Segment::kWhole;
      const auto key = std::make_pair(in.layer, static_cast<int>(in.pass));
      auto it = whole ? priced.find(key) : priced.end();
      double t = it != priced.end() ? it->second : loads.expert_time(in, load);
      if (!std::isfinite(t) || t < 0) {
        return invalid_argument("expert loads: the cost model has no time for '" + in.label + "' at load " +
                                std::to_string(load));
      }
      if (whole) priced.emplace(key, t);
      o.duration_s[s][i] = t;
    }
  }
  // Memory: the rank's busiest step over its own MoE layers.
  const auto buffers = experts_buffers(prog);
  std::vector<int> held;
  for (const auto& [buffer, b] : buffers) {
    if (std::find(held.begin(), held.end(), b.layer) == held.end()) held.push_back(b.layer);
  }
  std::sort(held.begin(), held.end());
  const std::vector<double> peak = loads.loads.peak_over(held, ep_rank);
  for (const auto& [buffer, b] : buffers) {
    const size_t k = static_cast<size_t>(std::lower_bound(held.begin(), held.end(), b.layer) - held.begin());
    o.buffer_bytes[buffer] = std::llround(static_cast<double>(b.bytes) * peak[k] / loads.plan_load);
  }
  return o;
}

std::vector<size_t> load_steps(const ExpertRankLoads& loads) {
  const size_t n = loads.loads.step_factor.size();
  if (!loads.on() || loads.first_step >= n) return {};
  const size_t count = n - loads.first_step, take = std::min(count, kMaxLoadSteps);
  std::vector<size_t> out;
  for (size_t k = 0; k < take; ++k) out.push_back(loads.first_step + k * count / take);
  return out;
}

}  // namespace piper::sim
