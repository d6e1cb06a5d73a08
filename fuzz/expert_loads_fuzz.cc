// Measured expert loads (`estimate|simulate --expert-loads FILE`, written by `train --record-expert-loads`):
// parse_expert_loads; a file that loads must survive its own writer unchanged and give a finite imbalance in [1, ep]
// and a finite memory load >= 1 (its ranks' busiest steps) for every ep that divides its experts, and finite
// busiest-step factors over its layers for every rank.
#include <cmath>
#include <cstdint>

#include "fuzz_common.h"
#include "piper/balance/expert_loads.h"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<balance::ExpertLoads> loads = balance::parse_expert_loads(fuzz::as_text(data, size), "loads.json");
  if (!loads.ok()) return 0;
  const std::string written = loads->to_json().dump();
  Result<balance::ExpertLoads> again = balance::parse_expert_loads(written, "rewritten");
  fuzz::require(again.ok() && again->to_json().dump() == written, "expert loads round trip", written);
  for (int ep = 1; ep <= loads->num_experts && ep <= 64; ++ep) {
    if (loads->num_experts % ep != 0) continue;
    Result<double> imbalance = balance::contiguous_imbalance(*loads, ep);
    fuzz::require(imbalance.ok() && std::isfinite(*imbalance) && *imbalance >= 1.0 - 1e-9 &&
                      *imbalance <= ep + 1e-9,
                  "imbalance in [1, ep]", std::to_string(ep));
    Result<double> memory = balance::contiguous_memory_load(*loads, ep);
    fuzz::require(memory.ok() && std::isfinite(*memory) && *memory >= 1.0 - 1e-9, "memory load finite, >= 1",
                  std::to_string(ep));
    Result<balance::RankLoads> ranks = balance::contiguous_rank_loads(*loads, ep);
    fuzz::require(ranks.ok(), "rank loads of a dividing ep", std::to_string(ep));
    for (int r = 0; r < ep; ++r) {
      for (double f : ranks->peak_over(ranks->layers, r)) {
        fuzz::require(std::isfinite(f) && f >= 0, "a rank's busiest-step factors finite, >= 0", std::to_string(r));
      }
    }
  }
  return 0;
}
