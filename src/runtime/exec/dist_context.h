// DistContext: what one rank of a multi-rank run needs to execute its Program of a compiled Plan over MPI.
//
// Every rank compiles the same Plan deterministically from the same model, strategy and flags; create()
// checks that by comparing a 64-bit FNV-1a hash of Plan::to_json() across ranks (docs/runtime.md) and fails on
// every rank, naming the first rank whose plan differs, instead of running mismatched programs.
// It then builds the communicators the executor uses, each a separate matching context:
//   p2p      pipeline send/recv (all channels; messages are told apart by the plan's tags, unique per plan)
//   dp, edp, ep, tp   one communicator per mesh axis of degree > 1, over the ranks that share every other
//            coordinate (edp: same expert shard; ep: same dp/ep block), members in world-rank order; when the plan
//            reduces the experts over its edp group (Plan::experts_reduce_over_edp: folded tp x ep, etp > 1, or
//            sequence parallelism) ep and edp are the plan's groups (Plan::group_ranks), edp then with tensor ranks
//   etp      expert tensor parallelism (etp > 1): the plan's etp group (Plan::group_ranks), whose ranks slice the
//            same experts and gather / reduce-scatter their rows (executor_ep.cc)
//   ctl      per-step control traffic: global gradient norm and loss reduction (rank order, in doubles)
// and, last, starts this rank's heartbeat (comm/heartbeat.h; PIPER_HEARTBEAT_S, checked first), which beats until
// the context is destroyed: every wait of the run then fails within seconds, naming the rank, when one stops.
// Collective over `world`: every rank calls create() in the same order. The communicators are owned here; the
// world must outlive the context. Thread-safety: each communicator is used by one stream thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "piper/base/status.h"
#include "piper/comm/communicator.h"
#include "piper/compile/plan.h"

namespace piper::runtime {

class DistContext {
 public:
  static Result<std::unique_ptr<DistContext>> create(comm::Communicator& world, const compile::Plan& plan);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const compile::RankCoord& coord() const { return coord_; }
  const compile::Plan& plan() const { return *plan_; }
  // World rank of pipeline rank `pp_rank` in this rank's pipeline (same dp, ep, tp coordinates); -1 if none.
  int pipeline_peer(int pp_rank) const;
  comm::Communicator& p2p() { return *p2p_; }
  comm::Communicator& ctl() { return *ctl_; }
  // The communicator of mesh axis `axis` (dp, edp, ep, etp, tp); nullptr when the axis has degree 1.
  comm::Communicator* group(const std::string& axis) const;
  // Seconds any single wait may take before the rank gives up naming its peer (PIPER_COMM_TIMEOUT_S).
  double timeout_s() const { return timeout_s_; }
  // World ranks per (emulated) node, node-major: what HALO exchanges take as the topology. Default: the MPI
  // job's local size (OMPI_COMM_WORLD_LOCAL_SIZE), else the whole world on one node.
  int ranks_per_node() const { return ranks_per_node_; }
  // InvalidArgument unless k >= 1 divides the world size.
  Status set_ranks_per_node(int k);

 private:
  DistContext() = default;
  int rank_ = 0, world_size_ = 1;
  compile::RankCoord coord_;
  const compile::Plan* plan_ = nullptr;
  std::unique_ptr<comm::Communicator> p2p_, ctl_;
  std::map<std::string, std::unique_ptr<comm::Communicator>> groups_;
  std::unique_ptr<comm::Heartbeat> heartbeat_;
  double timeout_s_ = 60;
  int ranks_per_node_ = 1;
};

}  // namespace piper::runtime
