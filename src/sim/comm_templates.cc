#include "piper/sim/comm_templates.h"

#include <algorithm>
#include <climits>
#include <map>
#include <tuple>
#include <unordered_map>

#include "piper/sim/collectives.h"

namespace piper::sim {
namespace {

// Source-side links: a flow whose first hop is one of these starts on `node`.
bool starts_on_node(const Link& first, int node) {
  return first.node == node &&
         (first.kind == LinkKind::kPortOut || first.kind == LinkKind::kPair || first.kind == LinkKind::kNicTx);
}

std::vector<int> depths(const FlowSim& sim) {
  std::vector<int> d(static_cast<size_t>(sim.num_flows()), 0);
  for (int f = 0; f < sim.num_flows(); ++f) {
    for (int a : sim.flow(f).after)
      d[static_cast<size_t>(f)] = std::max(d[static_cast<size_t>(f)], d[static_cast<size_t>(a)] + 1);
  }
  return d;
}

}  // namespace

FlowTemplate exact_template(const FlowSim& scratch, const std::vector<int>& flows) {
  FlowTemplate t;
  std::unordered_map<int, int> index;
  for (int id : flows) {
    const FlowSpec& s = scratch.flow(id);
    FlowTemplate::Flow f;
    f.hops = s.hops;
    f.bytes = s.bytes;
    f.latency_s = s.latency_s;
    for (int a : s.after) {
      auto it = index.find(a);
      if (it != index.end()) f.after.push_back(it->second);
    }
    index[id] = static_cast<int>(t.flows.size());
    t.flows.push_back(std::move(f));
  }
  t.finalize();
  return t;
}

FlowTemplate aggregate_template(const Network& net, const FlowSim& scratch,
                                const std::vector<std::vector<int>>& instances, int rep_node) {
  const std::vector<int> depth = depths(scratch);
  int max_depth = 0;
  for (int d : depth) max_depth = std::max(max_depth, d);
  // Flows of all instances per (depth, link), and the representative flows.
  std::vector<std::unordered_map<int, double>> all(static_cast<size_t>(max_depth) + 1), rep(all.size());
  std::vector<bool> is_rep(static_cast<size_t>(scratch.num_flows()), false);
  std::vector<std::vector<int>> rep_at(all.size());
  for (size_t k = 0; k < instances.size(); ++k) {
    for (int id : instances[k]) {
      const FlowSpec& s = scratch.flow(id);
      if (s.hops.empty()) continue;
      const size_t d = static_cast<size_t>(depth[static_cast<size_t>(id)]);
      for (const Hop& h : s.hops) all[d][h.link] += h.weight;
      if (k == 0 && starts_on_node(net.links()[static_cast<size_t>(s.hops[0].link)], rep_node)) {
        is_rep[static_cast<size_t>(id)] = true;
        rep_at[d].push_back(id);
        for (const Hop& h : s.hops) rep[d][h.link] += h.weight;
      }
    }
  }
  // Representative flows by (source, destination, step), and the nodes the representative instance spans.
  std::map<std::tuple<int, int, int>, int> image;
  int first_node = INT32_MAX, last_node = -1;
  for (int id : instances[0]) {
    const FlowSpec& s = scratch.flow(id);
    for (int d : {s.src_device, s.dst_device}) {
      if (d < 0) continue;
      first_node = std::min(first_node, net.node_of(d));
      last_node = std::max(last_node, net.node_of(d));
    }
    if (is_rep[static_cast<size_t>(id)] && s.src_device >= 0) {
      image.emplace(std::make_tuple(s.src_device, s.dst_device, depth[static_cast<size_t>(id)]), id);
    }
  }
  const int span = last_node >= first_node ? last_node - first_node + 1 : 0;
  // Order by (depth, id) so that every dependency points to an earlier flow.
  FlowTemplate t;
  std::unordered_map<int, int> index;
  for (size_t d = 0; d < rep_at.size(); ++d) {
    for (int id : rep_at[d]) {
      const FlowSpec& s = scratch.flow(id);
      FlowTemplate::Flow f;
      for (const Hop& h : s.hops) f.hops.push_back({h.link, h.weight * all[d][h.link] / rep[d][h.link]});
      f.bytes = s.bytes;
      f.latency_s = s.latency_s;
      std::vector<int> after;
      for (int a : s.after) {
        if (is_rep[static_cast<size_t>(a)]) {
          after.push_back(index.at(a));
          continue;
        }
        // A flow from another node: wait for its image on the representative's node (the same flow shifted by
        // whole nodes, wrapping inside the nodes the collective spans), which finishes at the same time when the
        // cluster is symmetric; without one, a barrier on the representative flows of the dependency's step.
        const FlowSpec& dep = scratch.flow(a);
        if (dep.src_device >= 0 && dep.dst_device >= 0 && span > 0) {
          const int shift = rep_node - net.node_of(dep.src_device);
          auto moved = [&](int device) {
            const int node = first_node + ((net.node_of(device) - first_node + shift) % span + span) % span;
            return node * net.devices_per_node() + device % net.devices_per_node();
          };
          auto it =
              image.find(std::make_tuple(moved(dep.src_device), moved(dep.dst_device), depth[static_cast<size_t>(a)]));
          if (it != image.end()) {
            after.push_back(index.at(it->second));
            continue;
          }
        }
        for (int e = depth[static_cast<size_t>(a)]; e >= 0; --e) {
          if (rep_at[static_cast<size_t>(e)].empty()) continue;
          for (int b : rep_at[static_cast<size_t>(e)]) after.push_back(index.at(b));
          break;
        }
      }
      std::sort(after.begin(), after.end());
      after.erase(std::unique(after.begin(), after.end()), after.end());
      f.after = std::move(after);
      index[id] = static_cast<int>(t.flows.size());
      t.flows.push_back(std::move(f));
    }
  }
  t.finalize();
  return t;
}

Result<CommTemplates> CommTemplates::create(const Network& net, const compile::Plan& plan, bool reduced) {
  if (plan.world_size > net.num_devices()) {
    return invalid_argument("the plan has " + std::to_string(plan.world_size) + " ranks but the cluster has " +
                            std::to_string(net.num_devices()) + " devices; raise --nodes or shrink the strategy");
  }
  if (plan.coords.size() != static_cast<size_t>(plan.world_size)) {
    return invalid_argument("plan: coords has " + std::to_string(plan.coords.size()) + " entries for " +
                            std::to_string(plan.world_size) + " ranks");
  }
  return CommTemplates(net, plan, reduced);
}

Result<std::vector<int>> CommTemplates::group(int rank, const std::string& axis) const {
  // The compiler's groups (Plan::group_ranks), so that the simulator loads the links the plan's layout uses; the
  // simulator prices collectives only, so pp (send/recv pairs) is not a group here.
  if (axis != "tp" && axis != "dp" && axis != "ep" && axis != "edp" && axis != "etp") {
    return invalid_argument("collective over axis '" + axis + "': the simulator knows tp, dp, ep, edp and etp groups");
  }
  return plan_->group_ranks(rank, axis);
}

std::vector<std::vector<int>> CommTemplates::ring_channels(const std::vector<int>& ranks) const {
  // Rank r runs on device r. NCCL runs one ring per NIC-rail channel: with c group members per node on k > 1
  // nodes, channel j visits each node's members rotated by j, so that its node-crossing hop leaves through a
  // different device's NIC; every channel carries 1/c of the buffer. One node or one member per node: one ring.
  std::vector<std::vector<int>> by_node;
  for (int r : ranks) {
    if (by_node.empty() || net_->node_of(by_node.back().front()) != net_->node_of(r)) by_node.emplace_back();
    by_node.back().push_back(r);
  }
  const size_t c = by_node.front().size();
  bool uniform = by_node.size() > 1 && c > 1;
  for (const auto& members : by_node) uniform = uniform && members.size() == c;
  if (!uniform) return {ranks};
  std::vector<std::vector<int>> rings(c);
  for (size_t j = 0; j < c; ++j) {
    for (const auto& members : by_node) {
      for (size_t i = 0; i < c; ++i) rings[j].push_back(members[(i + j) % c]);
    }
  }
  return rings;
}

Result<std::vector<std::vector<int>>> CommTemplates::add_instance(FlowSim* scratch, ir::NodeKind kind,
                                                                  const std::string& algorithm,
                                                                  const std::vector<int>& ranks) const {
  const std::vector<int>& devices = ranks;
  const int n = static_cast<int>(devices.size());
  std::vector<std::vector<int>> out;
  auto keep = [&](Result<CollectiveFlows> flows) -> Status {
    if (!flows.ok()) return flows.status();
    out.push_back(flows->flows);
    return ok_status();
  };
  switch (kind) {
    case ir::NodeKind::kAllReduce:
    case ir::NodeKind::kReduceScatter:
    case ir::NodeKind::kAllGather: {
      if (kind == ir::NodeKind::kAllReduce && algorithm == "tree") {
        PIPER_RETURN_IF_ERROR(keep(add_tree_all_reduce(*net_, scratch, devices, 1.0, 4)));
        break;
      }
      const std::vector<std::vector<int>> rings = ring_channels(devices);
      const double share = 1.0 / static_cast<double>(rings.size());
      for (const auto& ring : rings) {
        if (kind == ir::NodeKind::kAllReduce)
          PIPER_RETURN_IF_ERROR(keep(add_ring_all_reduce(*net_, scratch, ring, share)));
        if (kind == ir::NodeKind::kReduceScatter) {
          PIPER_RETURN_IF_ERROR(keep(add_ring_reduce_scatter(*net_, scratch, ring, share)));
        }
        if (kind == ir::NodeKind::kAllGather && algorithm == "ring_step") {
          PIPER_RETURN_IF_ERROR(keep(add_ring_shift(*net_, scratch, ring, share)));
        } else if (kind == ir::NodeKind::kAllGather) {
          PIPER_RETURN_IF_ERROR(keep(add_ring_all_gather(*net_, scratch, ring, share)));
        }
      }
      break;
    }
    case ir::NodeKind::kAllToAll:
      if (algorithm.rfind("halo", 0) == 0) {
        PIPER_RETURN_IF_ERROR(keep(add_halo_instance(scratch, algorithm, devices)));
      } else {
        PIPER_RETURN_IF_ERROR(keep(add_all_to_all_flat(*net_, scratch, devices, uniform_all_to_all(n, 1.0))));
      }
      break;
    default:
      return invalid_argument(std::string("collective kind ") + ir::to_string(kind) + " is not simulated");
  }
  return out;
}

Result<std::string> halo_template_key(const HaloSimModel& model, const compile::Instruction& in) {
  const bool fwd = in.pass == ir::Pass::kF;
  if (in.role != compile::CommRole::kEpDispatch && in.role != compile::CommRole::kEpCombine) {
    return invalid_argument("'" + in.label + "': a HALO all_to_all must be an ep dispatch or combine");
  }
  if (model.routing.top_k < 1 || model.token_bytes <= 0) {
    return invalid_argument("'" + in.label + "': a2a=halo needs the model's MoE routing (SimOptions::halo; "
                            "simulate() fills it from the model)");
  }
  const bool dispatch = (in.role == compile::CommRole::kEpDispatch) == fwd;
  const double tb = in.role == compile::CommRole::kEpDispatch && fwd ? model.dispatch_token_bytes : model.token_bytes;
  return std::string(dispatch ? "halo:dispatch:" : "halo:combine:") + std::to_string(tb) + ":" +
         std::to_string(in.comm_bytes);
}

Result<CollectiveFlows> CommTemplates::add_halo_instance(FlowSim* scratch, const std::string& key,
                                                         const std::vector<int>& devices) const {
  // key = halo:<shape>:<token bytes>:<payload> (halo_template_key).
  const size_t a = key.find(':'), b = key.find(':', a + 1), c = key.find(':', b + 1);
  if (a == std::string::npos || b == std::string::npos || c == std::string::npos) {
    return invalid_argument("HALO template key '" + key + "' is not halo:<shape>:<token bytes>:<payload>");
  }
  const std::string shape = key.substr(a + 1, b - a - 1);
  const double token_bytes = std::stod(key.substr(b + 1, c - b - 1)), payload = std::stod(key.substr(c + 1));
  const int n = static_cast<int>(devices.size());
  const int nodes = net_->node_of(devices.back()) - net_->node_of(devices.front()) + 1;
  const int per_node = n / std::max(1, nodes);
  int nics = 0;
  for (int d = 0; d < net_->devices_per_node(); ++d) nics = std::max(nics, net_->nic_of(d) + 1);
  const cost::HaloGroupShape g{nodes, per_node, nics > 0 && per_node % nics == 0 ? nics : 1};
  const int k = halo_.routing.top_k;
  if (payload <= 0 || token_bytes <= 0 || k < 1) return CollectiveFlows{};
  // The payload is the flat volume, tokens x top_k x token bytes per rank; flows are per unit payload.
  const double tokens = payload / (k * token_bytes);
  Result<cost::HaloTraffic> traffic =
      shape == "dispatch" ? cost::halo_dispatch_traffic(g, halo_.routing, tokens, token_bytes)
                          : cost::halo_combine_traffic(g, halo_.routing, tokens, token_bytes);
  PIPER_RETURN_IF_ERROR(traffic.status());
  for (cost::HaloMessage& m : traffic->messages) m.bytes /= payload;
  return add_halo_traffic(*net_, scratch, devices, *traffic);
}

Result<const FlowTemplate*> CommTemplates::collective(int rank, ir::NodeKind kind, const std::string& axis,
                                                      const std::string& algorithm) {
  PIPER_ASSIGN_OR_RETURN(std::vector<int> mine, group(rank, axis));
  const int pp = plan_->coords[static_cast<size_t>(rank)].pp;
  auto key = std::make_tuple(static_cast<int>(kind), axis, algorithm, reduced_ ? pp : mine.front());
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
  if (reduced_ && mine.size() > 1) {
    if (std::unique_ptr<FlowTemplate> moved = translated_collective(kind, axis, algorithm, pp)) {
      const FlowTemplate* out = moved.get();
      cache_.emplace(key, std::move(moved));
      ++translated_;
      return out;
    }
    built_pp_.emplace(std::make_tuple(static_cast<int>(kind), axis, algorithm), pp);
  }
  FlowSim scratch(net_->link_bandwidths());
  auto t = std::make_unique<FlowTemplate>();
  PIPER_ASSIGN_OR_RETURN(std::vector<std::vector<int>> own, add_instance(&scratch, kind, algorithm, mine));
  if (!reduced_ || mine.size() <= 1) {
    std::vector<int> flows;
    for (const auto& channel : own) flows.insert(flows.end(), channel.begin(), channel.end());
    *t = exact_template(scratch, flows);
  } else {
    // Every group instance of the axis in the rank's pipeline slice, the rank's own first (all its ring channels).
    std::vector<std::vector<int>> instances(1);
    for (const auto& channel : own) instances[0].insert(instances[0].end(), channel.begin(), channel.end());
    const int base = pp * slice_size();
    std::vector<bool> seen(static_cast<size_t>(slice_size()), false);
    for (int r : mine) seen[static_cast<size_t>(r - base)] = true;
    for (int o = 0; o < slice_size(); ++o) {
      if (seen[static_cast<size_t>(o)]) continue;
      PIPER_ASSIGN_OR_RETURN(std::vector<int> members, group(base + o, axis));
      for (int r : members) seen[static_cast<size_t>(r - base)] = true;
      PIPER_ASSIGN_OR_RETURN(std::vector<std::vector<int>> other, add_instance(&scratch, kind, algorithm, members));
      instances.emplace_back();
      for (const auto& channel : other) instances.back().insert(instances.back().end(), channel.begin(), channel.end());
    }
    *t = aggregate_template(*net_, scratch, instances, net_->node_of(rank));
  }
  const FlowTemplate* out = t.get();
  cache_.emplace(key, std::move(t));
  return out;
}

std::unique_ptr<FlowTemplate> CommTemplates::translated_collective(ir::NodeKind kind, const std::string& axis,
                                                                   const std::string& algorithm, int pp) {
  if (!reuse_slices_) return nullptr;
  auto built = built_pp_.find(std::make_tuple(static_cast<int>(kind), axis, algorithm));
  if (built == built_pp_.end()) return nullptr;
  const int dpn = net_->devices_per_node();
  if (slice_size() % dpn != 0) return nullptr;  // slices share nodes
  auto base = cache_.find(std::make_tuple(static_cast<int>(kind), axis, algorithm, built->second));
  if (base == cache_.end()) return nullptr;
  const int offset = (pp - built->second) * (slice_size() / dpn);
  // Nodes per fabric group and per scale-up domain (the first node of group / domain 1): the move must keep both.
  int per_group = net_->num_nodes(), per_domain = net_->num_nodes();
  for (int n = net_->num_nodes() - 1; n > 0; --n) {
    if (net_->group_of_node(n) != net_->group_of_node(0)) per_group = n;
    if (net_->domain_of_node(n) != net_->domain_of_node(0)) per_domain = n;
  }
  if (offset % per_group != 0 && net_->num_groups() > 1) return nullptr;
  if (offset % per_domain != 0 && per_domain < net_->num_nodes()) return nullptr;
  return translate(*base->second, offset);
}

std::unique_ptr<FlowTemplate> CommTemplates::translate(const FlowTemplate& base, int node_offset) {
  const std::vector<Link>& links = net_->links();
  if (link_ids_.empty()) {
    for (size_t l = 0; l < links.size(); ++l) {
      link_ids_.emplace(std::make_tuple(static_cast<int>(links[l].kind), links[l].node, links[l].index, links[l].peer),
                        static_cast<int>(l));
    }
  }
  int per_group = net_->num_nodes();
  for (int n = net_->num_nodes() - 1; n > 0; --n) {
    if (net_->group_of_node(n) != net_->group_of_node(0)) per_group = n;
  }
  std::unordered_map<int, int> moved;
  auto move = [&](int l) -> int {
    if (auto it = moved.find(l); it != moved.end()) return it->second;
    const Link& from = links[static_cast<size_t>(l)];
    int node = from.node, index = from.index;
    if (node >= 0) {
      node += node_offset;
    } else if (net_->num_groups() > 1) {  // fabric and global links belong to a group
      index += node_offset / per_group;
    }
    auto it = link_ids_.find(std::make_tuple(static_cast<int>(from.kind), node, index, from.peer));
    int to = -1;
    if (it != link_ids_.end()) {
      const Link& l2 = links[static_cast<size_t>(it->second)];
      if (l2.bw_bytes_per_s == from.bw_bytes_per_s && l2.latency_s == from.latency_s) to = it->second;
    }
    moved.emplace(l, to);
    return to;
  };
  auto t = std::make_unique<FlowTemplate>(base);
  for (FlowTemplate::Flow& f : t->flows) {
    for (Hop& h : f.hops) {
      h.link = move(h.link);
      if (h.link < 0) return nullptr;
    }
  }
  return t;
}

Result<const FlowTemplate*> CommTemplates::p2p(int src_rank, int dst_rank) {
  const int src_pp = plan_->coords[static_cast<size_t>(src_rank)].pp;
  const int dst_pp = plan_->coords[static_cast<size_t>(dst_rank)].pp;
  const int id = reduced_ ? src_pp * plan_->mesh.pp + dst_pp : src_rank * plan_->world_size + dst_rank;
  auto key = std::make_tuple(-1, std::string(), std::string(), id);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
  FlowSim scratch(net_->link_bandwidths());
  auto t = std::make_unique<FlowTemplate>();
  PIPER_ASSIGN_OR_RETURN(CollectiveFlows mine, add_p2p(*net_, &scratch, src_rank, dst_rank, 1.0));
  if (!reduced_) {
    *t = exact_template(scratch, mine.flows);
  } else {
    // Every pair of the two slices with the same (dp, tp) offset sends at once.
    std::vector<std::vector<int>> instances = {mine.flows};
    const int n = slice_size();
    const int src_off = src_rank - src_pp * n, dst_off = dst_rank - dst_pp * n;
    for (int o = 0; o < n; ++o) {
      if (o == src_off) continue;
      PIPER_ASSIGN_OR_RETURN(CollectiveFlows other, add_p2p(*net_, &scratch, src_pp * n + o,
                                                            dst_pp * n + (o - src_off + dst_off + n) % n, 1.0));
      instances.push_back(other.flows);
    }
    *t = aggregate_template(*net_, scratch, instances, net_->node_of(src_rank));
  }
  const FlowTemplate* out = t.get();
  cache_.emplace(key, std::move(t));
  return out;
}

Result<const FlowTemplate*> CommTemplates::m2n(int src_rank, int dst_pp) {
  const compile::RankCoord src = plan_->coords[static_cast<size_t>(src_rank)];
  const int id = reduced_ ? src.pp * plan_->mesh.pp + dst_pp : src_rank * plan_->world_size + dst_pp;
  auto key = std::make_tuple(-2, std::string("m2n"), std::string(), id);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
  const int ep = std::max(1, plan_->mesh.ep);
  // One sender's flows: to each ep rank of its block (and tp coordinate) on dst_pp, 1/ep of the unit payload; the
  // plan names them (Plan::m2n_peers), as for the runtime.
  auto add_sender = [&](FlowSim* scratch, int sender) -> Result<std::vector<int>> {
    const std::vector<int> receivers = plan_->m2n_peers(sender, dst_pp);
    if (static_cast<int>(receivers.size()) != ep) {
      return internal_error("simulate: the plan gives rank " + std::to_string(sender) + " " +
                            std::to_string(receivers.size()) + " m2n peers on pipeline rank " + std::to_string(dst_pp) +
                            ", expected ep=" + std::to_string(ep));
    }
    PIPER_ASSIGN_OR_RETURN(CollectiveFlows f,
                           add_m2n(*net_, scratch, {sender}, receivers,
                                   {std::vector<double>(receivers.size(), 1.0 / static_cast<double>(ep))}));
    return f.flows;
  };
  FlowSim scratch(net_->link_bandwidths());
  auto t = std::make_unique<FlowTemplate>();
  PIPER_ASSIGN_OR_RETURN(std::vector<int> mine, add_sender(&scratch, src_rank));
  if (!reduced_) {
    *t = exact_template(scratch, mine);
  } else {
    // Every rank of the sender's slice sends its share at once.
    std::vector<std::vector<int>> instances = {mine};
    const int n = slice_size();
    for (int o = 0; o < n; ++o) {
      const int other = src.pp * n + o;
      if (other == src_rank) continue;
      PIPER_ASSIGN_OR_RETURN(std::vector<int> flows, add_sender(&scratch, other));
      instances.push_back(flows);
    }
    *t = aggregate_template(*net_, scratch, instances, net_->node_of(src_rank));
  }
  const FlowTemplate* out = t.get();
  cache_.emplace(key, std::move(t));
  return out;
}

}  // namespace piper::sim
