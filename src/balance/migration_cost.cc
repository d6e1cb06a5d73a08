#include "piper/balance/migration_cost.h"

#include <algorithm>

#include "piper/spec/counting.h"

namespace piper::balance {

double expert_migration_bytes(const ModelSpec& model, const TrainSpec& train, int etp) {
  const int master = train.master_dtype != train.param_dtype ? dtype_bytes(train.master_dtype) : 0;
  const int per_param = dtype_bytes(train.param_dtype) + dtype_bytes(train.grad_dtype) +
                        2 * dtype_bytes(train.optimizer_dtype) + master;
  return static_cast<double>(expert_params(model)) / std::max(1, etp) * per_param;
}

MigrationCost migration_cost(const ModelSpec& model, const TrainSpec& train, const ClusterSpec& cluster, int etp,
                             double steps_next_window, double time_per_token_s) {
  MigrationCost cost;
  cost.bytes_per_expert = expert_migration_bytes(model, train, etp);
  cost.link_bw_bytes_per_s = cluster.node.intra.bw_bytes_per_s;
  cost.link_latency_s = cluster.node.intra.latency_s;
  cost.steps_next_window = steps_next_window;
  cost.time_per_token_s = time_per_token_s;
  return cost;
}

}  // namespace piper::balance
