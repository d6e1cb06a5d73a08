#include "piper/runtime/exec/dist_context.h"

#include <cstdlib>
#include <cstring>

namespace piper::runtime {
namespace {

// Ranks that share every coordinate of `me` that `same` says must match, in world-rank order.
template <typename Same>
std::vector<int> members(const compile::Plan& plan, const compile::RankCoord& me, Same same) {
  std::vector<int> out;
  for (int r = 0; r < plan.world_size; ++r) {
    if (same(plan.coords[static_cast<size_t>(r)], me)) out.push_back(r);
  }
  return out;
}

}  // namespace

int DistContext::pipeline_peer(int pp_rank) const {
  for (int r = 0; r < plan_->world_size; ++r) {
    const compile::RankCoord& c = plan_->coords[static_cast<size_t>(r)];
    if (c.pp == pp_rank && c.dp == coord_.dp && c.ep == coord_.ep && c.tp == coord_.tp) return r;
  }
  return -1;
}

comm::Communicator* DistContext::group(const std::string& axis) const {
  auto it = groups_.find(axis);
  return it == groups_.end() ? nullptr : it->second.get();
}

Status DistContext::set_ranks_per_node(int k) {
  if (k < 1 || world_size_ % k != 0) {
    return invalid_argument("ranks per node " + std::to_string(k) + " does not divide the " +
                            std::to_string(world_size_) + " ranks; pick a divisor");
  }
  ranks_per_node_ = k;
  return ok_status();
}

Result<std::unique_ptr<DistContext>> DistContext::create(comm::Communicator& world, const compile::Plan& plan) {
  if (world.size() != plan.world_size) {
    return invalid_argument("the plan is for " + std::to_string(plan.world_size) + " ranks but the MPI job has " +
                            std::to_string(world.size()) + "; start it with --ranks " +
                            std::to_string(plan.world_size) + " (or mpirun -np " + std::to_string(plan.world_size) +
                            ")");
  }
  // Checked before any collective, so that every rank refuses a bad value the same way.
  PIPER_ASSIGN_OR_RETURN(comm::HeartbeatOptions heartbeat, comm::heartbeat_options_from_env());
  auto ctx = std::unique_ptr<DistContext>(new DistContext());
  ctx->rank_ = world.rank();
  ctx->world_size_ = world.size();
  ctx->plan_ = &plan;
  ctx->coord_ = plan.coords[static_cast<size_t>(ctx->rank_)];
  PIPER_ASSIGN_OR_RETURN(ctx->timeout_s_, comm::timeout_from_env());
  ctx->ranks_per_node_ = ctx->world_size_;
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const int k = std::atoi(local);
    if (k >= 1 && ctx->world_size_ % k == 0) ctx->ranks_per_node_ = k;
  }

  // Every rank compiled its own plan: they must be the same program set.
  const uint64_t mine = compile::plan_hash(plan);
  std::vector<uint64_t> all(static_cast<size_t>(world.size()));
  PIPER_ASSIGN_OR_RETURN(comm::Handle h, world.all_gather(&mine, all.data(), sizeof(mine)));
  PIPER_RETURN_IF_ERROR(world.wait(h, ctx->timeout_s_));
  for (int r = 0; r < world.size(); ++r) {
    if (all[static_cast<size_t>(r)] != all[0]) {
      return failed_precondition("rank " + std::to_string(r) + " compiled a different plan than rank 0 (plan hash " +
                                 std::to_string(all[static_cast<size_t>(r)]) + " vs " + std::to_string(all[0]) +
                                 "); every rank must run the same binary with the same model, strategy and flags");
    }
  }

  PIPER_ASSIGN_OR_RETURN(ctx->p2p_, world.dup("p2p"));
  PIPER_ASSIGN_OR_RETURN(ctx->ctl_, world.dup("ctl"));
  const ir::MeshInfo& m = plan.mesh;
  const int ep = std::max(1, m.ep);
  // When the plan reduces the experts over its edp group (Plan::experts_reduce_over_edp: folded tp x ep, expert
  // tensor parallelism, or sequence parallelism) the experts' groups are the plan's (Plan::group_ranks): ep
  // (folded: ep consecutive ranks of the stage's tp*dp ranks), edp = every rank of the stage with the same expert
  // slice, tensor ranks included (MeshInfo::expert_replicas ranks), and etp, the ranks that slice the same experts.
  const bool plan_groups = plan.experts_reduce_over_edp();
  using C = compile::RankCoord;
  struct Axis {
    const char* name;
    int degree;
    bool (*same)(const C&, const C&, int);
  };
  const Axis axes[] = {
      {"dp", m.dp, [](const C& a, const C& b, int) { return a.pp == b.pp && a.tp == b.tp; }},
      {"edp", m.dp / ep, [](const C& a, const C& b, int) { return a.pp == b.pp && a.tp == b.tp && a.ep == b.ep; }},
      {"ep", ep, [](const C& a, const C& b, int e) { return a.pp == b.pp && a.tp == b.tp && a.dp / e == b.dp / e; }},
      {"tp", m.tp, [](const C& a, const C& b, int) { return a.pp == b.pp && a.dp == b.dp; }},
      {"etp", std::max(1, m.etp), nullptr},
  };
  for (const Axis& axis : axes) {
    const std::string name = axis.name;
    const bool from_plan = (plan_groups && (name == "ep" || name == "edp")) || name == "etp";
    const int degree = from_plan && name == "edp" ? m.expert_replicas() : axis.degree;
    if (degree <= 1) continue;
    std::vector<int> group;
    if (from_plan) {
      PIPER_ASSIGN_OR_RETURN(group, plan.group_ranks(ctx->rank_, name));
    } else {
      group = members(plan, ctx->coord_, [&](const C& c, const C& me) { return axis.same(c, me, ep); });
    }
    PIPER_ASSIGN_OR_RETURN(auto comm, world.split(group, axis.name));
    if (comm == nullptr || comm->size() != degree) {
      return internal_error(std::string("mesh group '") + axis.name + "' of rank " + std::to_string(ctx->rank_) +
                            " has " + std::to_string(group.size()) + " ranks, expected " + std::to_string(degree));
    }
    ctx->groups_[axis.name] = std::move(comm);
  }
  // Last, once every communicator exists: a rank that stops from here on is named within silence_s.
  PIPER_ASSIGN_OR_RETURN(ctx->heartbeat_, world.start_heartbeat(heartbeat));
  return ctx;
}

}  // namespace piper::runtime
