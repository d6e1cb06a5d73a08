#include "piper/cost/tp_overlap.h"

#include <algorithm>

namespace piper::cost {

BlockGemms block_gemms(const PartTable& table, const DeviceModel& device, const PartShape& shape, Part matmul) {
  BlockGemms out;
  double last = 0;  // the output projection's share of the block's weights
  if (matmul == Part::kAttention) {
    last = table.attention_out_share;
  } else if (matmul == Part::kDenseMlp || matmul == Part::kSharedExperts) {
    last = table.mlp_out_share;
  } else {
    return out;
  }
  const PartCost c = part_cost(table, matmul, shape);
  const TaskCost* tasks[3] = {&c.f, &c.b, &c.w};
  for (size_t k = 0; k < 3; ++k) {
    const double t = device.time_s(tasks[k]->flops, tasks[k]->bytes, tasks[k]->gemm_dim);
    const double first = k == 0 ? 1 - last : last;  // forward: input projection first; backward: output first
    out.first_s[k] = first * t;
    out.last_s[k] = (1 - first) * t;
    out.first_flops[k] = first * tasks[k]->flops;
    out.last_flops[k] = (1 - first) * tasks[k]->flops;
  }
  return out;
}

double tp_overlap_all_gather_exposed_s(double comm_s, double gemm_s, int pieces) {
  const double n = std::max(1, pieces);
  return std::max(0.0, comm_s - gemm_s * (n - 1) / n);
}

double tp_overlap_reduce_scatter_exposed_s(double comm_s, double gemm_s, int pieces) {
  const double n = std::max(1, pieces);
  return std::max(comm_s / n, comm_s - gemm_s * (n - 1) / n);
}

}  // namespace piper::cost
