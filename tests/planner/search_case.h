// A search's inputs loaded from the presets (configs/): the model, the cluster on `nodes` nodes, and a TrainSpec with
// the global batch and sequence length. Shared by the planner's search tests.
#pragma once

#include <cstdint>
#include <string>

#include "piper/base/check.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::planner::test_support {

struct SearchCase {
  ModelSpec model;
  ClusterSpec cluster;
  TrainSpec train;
};

inline SearchCase make_case(const std::string& model, const std::string& cluster, int nodes, int64_t batch,
                            int64_t seq) {
  auto m = load_model(model);
  auto c = load_cluster(cluster, nodes);
  PIPER_CHECK(m.ok() && c.ok(), "test presets must load");
  TrainSpec t;
  t.global_batch = batch;
  t.seq_len = seq;
  return {*m, *c, t};
}

}  // namespace piper::planner::test_support
