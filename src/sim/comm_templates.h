// CommTemplates: the flows of the communication instructions of a Plan, as FluidNet templates.
//
// Rank r of a Plan runs on device r of the cluster (devices are numbered node-major; the compiler numbers ranks
// tp innermost, then dp with ep inside it, then pp: plan.coords). Groups of a collective over axis
//   tp: same pp and dp            dp: same pp and tp
//   ep: same pp, tp and dp / ep   edp: same pp, tp and dp mod ep
// Collectives decompose as collectives.h does: all_reduce ring (or tree with algorithm "tree"), reduce_scatter and
// all_gather ring (bytes = the full buffer); a ring group with c > 1 members on each of several nodes runs c
// channels (NCCL's rings, one per NIC rail: channel j rotates each node's members by j so its node-crossing hop
// uses another NIC) carrying 1/c of the buffer each, which is the closed form's min(intra, c * NIC) bandwidth;
// all_to_all flat (uniform: every rank sends bytes / n to every rank)
// or HALO: the messages of the runtime's HALO MoE dispatch or combine (cost/halo_traffic.h, one lane per NIC of a
// node when that divides the group's ranks per node), from the plan's routing (HaloSimModel). A HALO all_to_all's
// template key is halo_template_key(): its shape (dispatch or combine), token bytes and payload, because the
// deduplicated volume is not proportional to the payload alone (the multiplicity lists and slot metadata are
// per token) and the direct-send threshold compares absolute block sizes.
//
// Two modes:
//  - full: the template of one group instance (or one send/recv pair) with its exact flows; the caller starts it
//    once every member has arrived.
//  - reduced (representative ranks): every rank of a pipeline slice runs the same program, so all instances of a
//    group run the same collective at the same time. The template holds only the flows of the representative's
//    instance whose source is on the representative's node, and each hop weighs
//        (flows of all instances at that step crossing the link) / (representative flows at that step crossing it)
//    so that links carry the load of every instance (flow_sim.h's aggregate flows). A step is a flow's depth in
//    the collective's dependency DAG (ring step, HALO phase). A dependency on a flow from another node becomes a dependency
//    on that flow's image on the representative's node (shifted by whole nodes, wrapping inside the nodes the
//    instance spans: in a ring, the flow entering the node waits like the flow leaving it), or, when there is no
//    image, a barrier on the representative flows of the same step. On symmetric clusters (every node alike,
//    every group laid out alike) this completes exactly when the full set of flows does; tests compare the two.
// Templates are built once per shape and cached; payload scaling happens at FluidNet::start().
// Thread-safety: none.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "piper/base/status.h"
#include "piper/compile/plan.h"
#include "piper/cost/halo_traffic.h"
#include "piper/sim/collectives.h"
#include "piper/sim/fluid.h"
#include "piper/sim/network.h"

namespace piper::sim {

// What the simulator needs of the MoE routing to build HALO templates. routing.top_k = 0: unknown (a HALO
// all_to_all is then an error naming SimOptions::halo).
struct HaloSimModel {
  cost::HaloRouting routing{0, 0, 1, 1};
  double dispatch_token_bytes = 0;  // the forward dispatch's wire bytes per token (fp8 under DeepSeek's recipe)
  double token_bytes = 0;           // every other ep all-to-all's
};

// The template key of a HALO all_to_all instruction: "halo:dispatch:<token bytes>:<payload>" when the traffic is
// dispatch-shaped (forward dispatch, and the combine's backward: the runtime runs halo_dispatch for both), else
// "halo:combine:...". Errors: a HALO all_to_all without an ep dispatch/combine role, or with no routing model.
Result<std::string> halo_template_key(const HaloSimModel& model, const compile::Instruction& in);

class CommTemplates {
 public:
  // Errors when the plan needs more devices than the network has.
  static Result<CommTemplates> create(const Network& net, const compile::Plan& plan, bool reduced);

  // Sorted global ranks of `rank`'s group along `axis` (tp, dp, ep, edp). Errors name an unknown axis.
  Result<std::vector<int>> group(int rank, const std::string& axis) const;

  // The template of collective `kind` (all_reduce, reduce_scatter, all_gather, all_to_all) over `axis` as run by
  // `rank`; payload = the instruction's comm_bytes.
  Result<const FlowTemplate*> collective(int rank, ir::NodeKind kind, const std::string& axis,
                                         const std::string& algorithm);
  // A send of `src_rank` to `dst_rank`; payload = bytes.
  Result<const FlowTemplate*> p2p(int src_rank, int dst_rank);
  // af-pipe: `src_rank`'s share of an M2N exchange with pipeline rank `dst_pp` (add_m2n): its payload spread
  // evenly over the ep ranks of its ep block there (the experts' blocks; the runtime's executor_m2n.cc).
  Result<const FlowTemplate*> m2n(int src_rank, int dst_pp);

  int num_templates() const { return static_cast<int>(cache_.size()); }
  // The routing behind HALO templates (algorithm = halo_template_key(...)).
  void set_halo_model(const HaloSimModel& model) { halo_ = model; }
  // Representative templates of collectives (reduced mode): the pipeline slices of a plan run the same groups on
  // whole nodes, so pipeline rank pp's template is pipeline rank p0's with every link moved by (pp - p0) x the
  // slice's nodes, when that move keeps every link's kind, bandwidth and latency and the fabric groups and scale-up
  // domains (the offset is a whole number of each). Such templates are translated instead of rebuilt from every
  // group instance of the slice (the same flows, bytes, weights and dependencies: CommTemplatesTest checks them
  // against rebuilt ones). Off: every pipeline rank's templates are built (SimOptions::reuse_slice_templates).
  void set_reuse_slices(bool on) { reuse_slices_ = on; }
  int num_translated() const { return translated_; }

 private:
  CommTemplates(const Network& net, const compile::Plan& plan, bool reduced) : net_(&net), plan_(&plan), reduced_(reduced) {}
  // Adds one group instance's flows (unit payload) to `scratch`; returns their ids per ring channel.
  Result<std::vector<std::vector<int>>> add_instance(FlowSim* scratch, ir::NodeKind kind, const std::string& algorithm,
                                        const std::vector<int>& ranks) const;
  // The flows of one HALO group instance for a halo_template_key (per unit payload).
  Result<CollectiveFlows> add_halo_instance(FlowSim* scratch, const std::string& key, const std::vector<int>& devices) const;
  std::vector<std::vector<int>> ring_channels(const std::vector<int>& ranks) const;
  int slice_size() const { return plan_->mesh.dp * plan_->mesh.tp; }
  // `base` with every link moved by node_offset nodes; nullptr when a moved link does not exist or differs.
  std::unique_ptr<FlowTemplate> translate(const FlowTemplate& base, int node_offset);
  std::unique_ptr<FlowTemplate> translated_collective(ir::NodeKind kind, const std::string& axis,
                                                      const std::string& algorithm, int pp);

  const Network* net_;
  const compile::Plan* plan_;
  bool reduced_;
  std::map<std::tuple<int, std::string, std::string, int>, std::unique_ptr<FlowTemplate>> cache_;
  HaloSimModel halo_;
  bool reuse_slices_ = true;
  int translated_ = 0;
  std::map<std::tuple<int, std::string, std::string>, int> built_pp_;  // the pipeline rank a shape was built for
  std::map<std::tuple<int, int, int, int>, int> link_ids_;             // (kind, node, index, peer) -> link
};

// Representative flows with aggregate weights (see above). `instances[0]` is the representative's instance;
// `rep_node` its node. Exposed for tests.
FlowTemplate aggregate_template(const Network& net, const FlowSim& scratch, const std::vector<std::vector<int>>& instances,
                                int rep_node);
// All flows of one instance with weight 1 and their exact dependencies.
FlowTemplate exact_template(const FlowSim& scratch, const std::vector<int>& flows);

}  // namespace piper::sim
