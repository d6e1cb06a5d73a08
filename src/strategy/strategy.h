// Strategy: how one training job is split over the world, in Megatron's convention.
//
//   world = dp * tp * pp            (every rank is one device)
//   ep divides dp                   experts are sharded over ep ranks inside the data-parallel group;
//                                   expert-data-parallel size edp = dp / ep replicates each expert shard
//   fold=1: ep divides tp*dp        Megatron's MoE parallel folding: the experts' own mesh (ep innermost, then
//                                   its replicas) is laid over the tp*dp ranks of each pipeline stage, so EP 8
//                                   stays inside a node next to TP 2 and ep may exceed dp (ep=32 with dp=16)
//   attention and dense parts are data-parallel over dp (and tensor-parallel over tp)
//   global batch = dp * microbatches * mbs
//
// Compact form (every key optional; defaults in parentheses):
//   dp(1) tp(1) pp(1) vpp(1) ep(1) etp(1) zero(0) sp(0) recompute(none|selective|full)
//   schedule(1f1b|gpipe|interleaved|zb-h1|dualpipev|af-pipe) microbatches(1) mbs(1)
//   a2a(flat|halo) order(tp-ep-dp-pp: mesh axes innermost first, '-' separated)
//   disagg(0|1) attn_ranks(0) ffn_ranks(0)    attention/FFN disaggregation (af-pipe)
//   attn_ports(0) ffn_ports(0)   af-pipe's NIC split (printed only when set; see Strategy::attn_ports)
//   fold(0|1)    MoE parallel folding (printed only when set)
//   tp_overlap(0|1)  tensor-parallel GEMM/collective overlap, Megatron's --tp-comm-overlap (printed only when set)
//   ep_overlap(0|1)  EP all-to-all overlap by F&B pairing, Megatron's --overlap-moe-expert-parallel-comm (printed
//                    only when set)
//   recompute_modules(layernorm+moe_act)  Megatron's --recompute-modules inside a MoE layer, '+' separated
//                    (printed only when set; see Strategy::recompute_modules)
// e.g. "dp=8,tp=1,pp=4,vpp=1,ep=8,zero=1,sp=0,recompute=none,schedule=1f1b,microbatches=16,mbs=1".
// to_string() prints every key, and parse(to_string(s)) == s.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"

namespace piper {

struct ModelSpec;
struct TrainSpec;

enum class Recompute { kNone, kSelective, kFull };
const char* to_string(Recompute r);

// Pipeline schedules a Strategy may name, in the order of the compact-form documentation. kCustom: a schedule
// registered in C++ (schedules::register_schedule, which calls register_schedule_name): the compiler, simulator
// and runtime run it; the closed form (cost/estimate) has no model of it and says so.
enum class ScheduleKind { k1F1B, kGPipe, kInterleaved, kZBH1, kDualPipeV, kAFPipe, kCustom };
const std::vector<std::string>& schedule_names();  // "1f1b", "gpipe", "interleaved", "zb-h1", "dualpipev", "af-pipe"
// The built-in names, then every registered one (sorted): what `schedule=` accepts.
std::vector<std::string> known_schedule_names();
// Makes `name` a valid `schedule=` value (kCustom). Not thread-safe: call at start-up, as register_schedule.
void register_schedule_name(const std::string& name);
// NotFound-free lookup: InvalidArgument listing the names (and a "did you mean") for an unknown name.
Result<ScheduleKind> parse_schedule(const std::string& name);
const char* to_string(ScheduleKind k);

// Pipeline stage `stage`'s layers [first, last) when `num_layers` are cut into `num_stages` contiguous, balanced
// stages, earlier stages taking the remainder: the compiler's partition, which the closed form counts too.
std::pair<int, int> stage_layers(int num_layers, int num_stages, int stage);

// tp_overlap: the pieces a reduce-scatter and the GEMM before it run as (Transformer Engine's num_splits for its
// "pipeline" method). One value for the compiler (compile/lower.cc) and the closed form (cost/tp_overlap.h).
inline constexpr int kTpOverlapRsPieces = 4;

struct Strategy {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int vpp = 1;  // virtual stages (model chunks) per pipeline rank
  int ep = 1;
  int etp = 1;      // expert tensor parallel (divides tp); 1 = experts not tensor-sliced
  int zero = 0;     // 0..3
  bool sp = false;  // sequence parallel (needs tp > 1 to matter)
  Recompute recompute = Recompute::kNone;
  std::string schedule = "1f1b";
  int microbatches = 1;
  int mbs = 1;
  std::string a2a = "flat";  // EP all-to-all algorithm: flat or halo
  // Mesh axes innermost (closest devices) first.
  std::vector<std::string> order = {"tp", "ep", "dp", "pp"};
  // Attention/FFN disaggregation: attention on attn_ranks = dp*tp*pp, experts on ffn_ranks (a multiple of ep): the
  // compiler runs ffn_ranks/(dp*tp) FFN pipeline ranks of dp*tp ranks (uneven when != pp; strategy_directives.h).
  bool disaggregate = false;
  int attn_ranks = 0;
  int ffn_ranks = 0;
  // af-pipe's NIC (port) split, as the disaggregation allocator's MILP chooses it (planner/disaggregate.h;
  // DisagMoE splits a cluster's GPUs and NICs between the two groups separately): the attention group's ranks share
  // attn_ports NICs' bandwidth and the FFN group's ffn_ports. 0 and 0 (the default): each group uses the NICs of
  // the nodes it occupies. Both set or neither; their sum at most the cluster's NICs (checked by the simulator and
  // the closed form, which price it; sim/nic_split.h). The CPU runtime has no NICs and ignores it.
  int attn_ports = 0;
  int ffn_ports = 0;
  // MoE parallel folding (Megatron-Core's expert mesh, --expert-tensor-parallel-size 1): within a pipeline stage
  // the tp*dp ranks, numbered tp innermost, form expert groups of ep consecutive ranks; a rank's experts are
  // replicated on the ranks tp*dp/ep apart. Without it ep is a sub-axis of dp (stride tp).
  bool fold = false;
  // Tensor-parallel communication overlap (Megatron-LM --tp-comm-overlap, Transformer Engine's userbuffers): the
  // all-gather before a tp chunk is pipelined with the chunk's first GEMM (ring exchange, tp pieces) and the
  // reduce-scatter after it with its last GEMM (4 pieces). Needs sp=1, as in Megatron. Modelled by estimate and
  // simulate (compile/lower.h: LowerOptions::tp_overlap) and run in those pieces by the CPU runtime
  // (runtime/exec/executor_tp_overlap.cc).
  bool tp_overlap = false;
  // Expert-parallel all-to-all overlap (Megatron-LM --overlap-moe-expert-parallel-comm, its "combined 1F1B"):
  // 1f1b and interleaved run one more warm-up forward, then every steady-state step's forward of one microbatch
  // and backward of another share a may-overlap slot, so one's dispatch/combine runs behind the other's compute
  // (as DualPipeV's F&B pairs; schedules/schedule.h). Needs ep >= 2, and interleaved when pp > 1 (as Megatron).
  bool ep_overlap = false;
  // Module-level recomputation inside a chunk (Megatron-LM --recompute-modules, the names it uses), on top of
  // `recompute`: "layernorm" drops a MoE layer's pre-MLP norm output (the router's and experts' input) and re-runs
  // the norm before the backward; "moe_act" drops the routed experts' activation output (fc2's input) and re-runs
  // the activation function. As in Megatron with Transformer Engine, the input norm and a dense layer's pre-MLP
  // norm are fused into the next linear (LayerNormLinear keeps its output), so only MoE layers are affected.
  // Sorted, no duplicates. Modelled by estimate, simulate and plan; the CPU runtime keeps these activations.
  std::vector<std::string> recompute_modules;
  bool recomputes_module(const std::string& name) const;

  int world_size() const { return disaggregate ? attn_ranks + ffn_ranks : dp * tp * pp; }
  // Model chunks (virtual stages) each pipeline rank holds: vpp for interleaved, 2 for dualpipev (the V shape:
  // rank r holds stages r and 2*pp-1-r), else 1. The model is cut into pp * chunks_per_rank() stages.
  int chunks_per_rank() const;
  int num_stages() const { return pp * chunks_per_rank(); }
  // The schedule as an enum. Precondition: validate() passed (an unknown name is a PIPER_CHECK failure).
  ScheduleKind schedule_kind() const;
  int edp() const { return dp / ep; }  // expert-data-parallel size (without fold)
  // Ranks of a pipeline stage holding the same expert slice: tp*dp / (ep*etp), folded or not.
  int expert_replicas() const { return dp * tp / (ep * etp); }
  // `axes` (a mesh order, innermost first) without the axes of size 1 here (tp, ep, edp for "dp", pp): two orders
  // with the same result lay the ranks out the same way.
  std::vector<std::string> order_without_unit_axes(const std::vector<std::string>& axes) const;
  // With fold the ranks are laid out tp, dp, pp and ep has no place of its own: `axes` without ep and without the
  // size-1 axes. fold=1 needs the default order's result.
  std::vector<std::string> folded_layout(const std::vector<std::string>& axes) const;
  int64_t global_batch() const { return static_cast<int64_t>(dp) * microbatches * mbs; }

  std::string to_string() const;
  Json to_json() const;
  bool operator==(const Strategy& other) const = default;

  // Parses the compact form or, if `text` starts with '{' or names an existing .json file, JSON.
  static Result<Strategy> parse(const std::string& text);
  static Result<Strategy> from_json(const Json& json);

  // Checks the strategy on its own (degrees positive, zero in 0..3, known schedule, ep divides dp, schedule
  // constraints such as m >= p for 1f1b and m >= 2p for dualpipev, ...). Errors name the rule and a fix.
  Status validate() const;
  // Checks it against a model, training setup and world size (world == dp*tp*pp, ep | num_experts,
  // pp*vpp <= layers, tp | heads, global batch == dp*microbatches*mbs, ...).
  Status validate_for(const ModelSpec& model, const TrainSpec& train, int world_size) const;
};

}  // namespace piper
