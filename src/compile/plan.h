// Plan: the compiled, per-rank programs that the simulator and the runtime both execute.
//
// A Program is a list of logical streams; each stream is a total order of instructions. Streams of one rank
// synchronise only through events (record on one stream, wait on another); ranks synchronise through
// matched send/recv (and m2n) pairs and collectives over mesh groups. Ranks that differ only by their data-
// or expert-parallel coordinate run the same Program (a *template*): Plan::templates holds one per pipeline
// rank and Plan::rank_template maps a global rank to it, so a 1,024-rank plan stores 16 programs for pp=16.
// Cost annotations are plain fields filled by a CostFn at lowering time (default: the graph's own estimates).
// The Plan is the whole contract between the compiler and the executors: every instruction carries what executing it
// needs (what a communication means, which chunk a compute runs, sizes), so the simulator reads no ir::Graph.
// Instruction::node is the id of the graph node it lowers, kept as an opaque key (messages between instructions
// are matched by it: Instruction::inputs / outputs); nothing that executes a plan looks the node up, and neither
// executor includes an ir/ header.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "piper/base/json.h"
#include "piper/base/status.h"
#include "piper/ir/types.h"
#include "piper/spec/part.h"

namespace piper::compile {

enum class OpKind : uint8_t { kCompute, kSend, kRecv, kCollective, kRecord, kWait, kAlloc, kFree, kUpdate };
const char* to_string(OpKind k);

// What a communication instruction means to an executor, decided by the compiler from the node it lowers.
enum class CommRole : uint8_t {
  kNone,          // not a communication (and a collective with none of the roles below)
  kPipeline,      // send/recv of an activation or gradient between pipeline ranks (group pp)
  kGradReduce,    // dp/edp all_reduce or reduce_scatter of gradients (ZeRO-1: mb < 0, after the last microbatch)
  kParamGather,   // dp/edp all_gather of ZeRO-sharded parameters (ZeRO-1/2: pass U, after the update or, with no
                  // inputs, before the next step's first forward; ZeRO-3: F/B)
  kTpGather,      // tp all_gather of activations (sequence parallelism; p2p_scatter_gather's re-assembly)
  kTpScatter,     // tp reduce_scatter of a tp block's output (sequence parallelism)
  kTpReduce,      // tp all_reduce of a tp block's output (no sequence parallelism)
  kEpDispatch,    // ep all_to_all that sends routed tokens to the experts (part "dispatch")
  kEpCombine,     // ep all_to_all that brings the experts' outputs back (part "combine")
  kEtpGather,     // etp all_gather of the experts' input rows (expert tensor parallelism: after the dispatch, F and B)
  kEtpScatter,    // etp reduce_scatter of the experts' partial output rows (before the combine, F and B)
  kM2NToExperts,  // m2n whose consuming chunk is the experts (af-pipe dispatch, forward)
  kM2NFromExperts,  // m2n whose producing chunk is the experts (af-pipe combine; the dispatch's gradient)
  kM2NDense,        // m2n between two chunks neither of which is the experts (a pipeline message across the sides)
  kTpGradSum,       // tp all_reduce of one chunk's gradients that are partial sums over tp (mb < 0, once per step,
                    // between its gradient or data-parallel reduction and its update; ir add_tp_grad_sums): the tensors
                    // a split chunk keeps whole and, under sequence parallelism, every tensor of an unsplit chunk
                    // but the experts reduced over edp; under ZeRO this rank's shard of them. comm_bytes: those
                    // elements' gradient bytes (ZeRO: their mean share per shard)
};
const char* to_string(CommRole r);

// Which part of its node's work an instruction does. Under tp_overlap (LowerOptions::tp_overlap) a tp
// chunk runs as pieces so that its collectives pipeline with its GEMMs: kIn = 1/pieces of the GEMM that consumes
// the all-gathered input, kOut = 1/pieces of the GEMM whose output is reduce-scattered, kRest = the rest of the
// node (split_in / split_out say which of the two GEMMs run as pieces elsewhere). A split collective's pieces are
// kIn (all-gather) or kOut (reduce-scatter) with comm_bytes of their own.
enum class Segment : uint8_t { kWhole, kIn, kRest, kOut };
const char* to_string(Segment s);

struct Instruction {
  OpKind op = OpKind::kCompute;
  ir::NodeId node = ir::kNoNode;  // the graph node it lowers (kNoNode for record/wait/alloc/free)
  std::string label;              // "L3.attn.F.mb2", "send L3.attn.F.mb2 -> rank 1", "wait e12"
  // The chunk and task (compute/update), or the node's tags (comm): pass, microbatch (-1: none), model layer (the
  // embedding's is 0, the head's the last layer's; -1: none) and part (spec/part.h): the chunk a compute or update
  // runs, or the chunk whose tensor a pipeline send/recv or a dp reduce/gather moves; nullopt for record/wait/
  // alloc/free and for a communication that belongs to no one chunk, whose node's tag is then `comm_part`
  // ("dispatch", "combine", "m2n", "attn.tp_ag", ...). A plan file writes either as "part" (the chunk's name,
  // chunk_name()); a compute or update with a name that is no chunk part is refused when the file is read.
  ir::Pass pass = ir::Pass::kNone;
  int mb = -1;
  int layer = -1;
  std::optional<Part> part;
  std::string comm_part;
  // The name a plan file writes as "part": chunk_name(*part), else comm_part ("" for neither).
  std::string part_name() const { return part ? chunk_name(*part) : comm_part; }
  // comm
  ir::NodeKind comm = ir::NodeKind::kChunk;  // send, recv, all_reduce, ..., m2n
  CommRole role = CommRole::kNone;
  std::string group;                         // mesh axis: dp, edp, ep, etp, tp, a2f, pp
  std::string algorithm;
  int peer = -1;     // send/recv/m2n: peer pipeline rank
  int64_t tag = -1;  // send/recv/m2n: matching key shared by both sides
  int event = -1;    // record/wait
  int buffer = -1;   // alloc/free
  // Cost annotations (per rank).
  int64_t flops = 0;
  int64_t bytes = 0;       // bytes read + written by a compute, or allocated/freed
  int64_t comm_bytes = 0;  // payload sent by this rank
  int64_t mem_delta = 0;   // change of live bytes on the rank when the instruction completes
  // Piece of a node (see Segment); kWhole for every instruction without tp_overlap.
  Segment segment = Segment::kWhole;
  int pieces = 1;          // kIn / kOut: how many pieces the GEMM or collective is cut into
  bool split_in = false;   // kRest: the input GEMM runs as kIn pieces
  bool split_out = false;  // kRest: the output GEMM runs as kOut pieces
  // Data flow, for executors (compile/exec_info.cc fills it from the node's live data edges; empty without a node).
  // A message between two instructions of a rank is named by the node id of the instruction that publishes it:
  // `inputs` are the nodes whose messages this instruction reads, in edge order (a compute F: its producers; a
  // backward: the consumers of its forward, whose gradients it reads; a send: its producer), `outputs` the nodes
  // that read its own. Every id is the node of an instruction of the same Program (plan_io checks it).
  std::vector<ir::NodeId> inputs;
  std::vector<ir::NodeId> outputs;
  bool recompute = false;  // compute: the chunk's F stash is dropped and rebuilt before its backward
  // compute F: Megatron's module recomputation (recompute_modules): the router's norm output ("layernorm") or the
  // experts' activation output ("moe_act") is dropped after F and recomputed before the backward that reads it.
  bool recompute_norm = false;
  bool recompute_act = false;
  std::string shard_axis;  // compute/update: the mesh axis the chunk's parameters are split over ("tp", "ep", "")
  // m2n: the parts of the chunks that produce and consume the exchanged tensor (the same on both sides), the layer
  // of the experts chunk at either end (-1: neither end is the experts), and where that layer's combine runs,
  // decided once by the compiler: true when the FFN group combines, because the experts' output feeds a chunk on
  // the FFN rank (the head) or the next layer's attention on another attention rank than the router's.
  std::optional<Part> src_part, dst_part;
  int experts_layer = -1;
  bool combine_on_ffn = false;
  bool operator==(const Instruction&) const = default;
};

struct Stream {
  std::string name;
  std::vector<Instruction> instrs;
  bool operator==(const Stream&) const = default;
};

struct Program {
  int pp_rank = 0;
  std::vector<Stream> streams;
  int64_t static_bytes = 0;  // parameters, gradients and optimizer state resident for the whole step
  size_t num_instructions() const;
  bool operator==(const Program&) const = default;
};

// The plan file's "format" and "version" (Plan::to_json). The version changes whenever a field changes meaning or
// a reader would need a field that older files lack.
inline constexpr const char* kPlanFormat = "piper-plan";
inline constexpr int kPlanFormatVersion = 2;  // 2: num_microbatches, num_layers, the executors' data flow

struct RankCoord {
  int pp = 0, dp = 0, ep = 0, tp = 0;
  bool operator==(const RankCoord&) const = default;
};

struct Plan {
  ir::MeshInfo mesh;
  int world_size = 1;
  std::vector<Program> templates;  // one per pipeline rank
  std::vector<int> rank_template;  // global rank -> index into templates
  std::vector<RankCoord> coords;   // global rank -> mesh coordinates
  int num_microbatches = 1;        // per step; every instruction's mb is below it
  int num_layers = 0;              // model layers; every instruction's layer is below it
  // Sequence parallelism (ir::Graph::sequence_parallel, decided by the tp shard directives): under it tensor rank
  // t holds rows [t n/tp, (t+1) n/tp) of a microbatch's n tokens outside the tp chunks, which all-gather their
  // input and reduce-scatter their output, and pipeline and m2n messages carry that slice. Executors read it here.
  bool sequence_parallel = false;
  // Whether the plan reduces the experts' gradients over its edp group (ir::MeshInfo::experts_reduce_over_edp).
  bool experts_reduce_over_edp() const { return mesh.experts_reduce_over_edp(sequence_parallel); }
  // Whether a chunk's gradients are partly partial over tp (ir::MeshInfo::grads_partial_over_tp).
  bool grads_partial_over_tp(bool split_over_tp, Part part) const {
    return mesh.grads_partial_over_tp(split_over_tp, part == Part::kExperts, sequence_parallel);
  }
  const Program& program(int rank) const {
    return templates[static_cast<size_t>(rank_template[static_cast<size_t>(rank)])];
  }
  // Every field, in the plan file format (`piper compile --emit-plan`; compile/plan_io.h reads it back): format
  // kPlanFormat, version kPlanFormatVersion, world_size, num_microbatches, num_layers, sequence_parallel (written
  // only when true), mesh, rank_template, coords, programs.
  Json to_json() const;
  bool operator==(const Plan&) const = default;

  // Global rank layout (the one place that defines it): tp innermost, then dp, then pp,
  //   rank = (pp * mesh.dp + dp) * mesh.tp + tp,   ep = dp mod mesh.ep,
  // so an expert-parallel group is a block of mesh.ep consecutive dp coordinates.
  int rank_of(const RankCoord& c) const;
  // The global rank that `rank`'s send/recv/m2n instruction with peer pipeline rank `peer_pp` talks to: the
  // rank with the same dp and tp coordinates on pipeline rank peer_pp.
  int p2p_peer(int rank, int peer_pp) const;
  // The ranks that `rank`'s routed m2n instruction (af-pipe: router <-> experts, experts <-> the next layer's
  // attention or its tp all-gather / reduce-scatter) with peer pipeline rank `peer_pp` exchanges with, ascending:
  // the ranks of peer_pp in `rank`'s expert group (same tp coordinate and ep block, MeshInfo::ep_block), peer i
  // holding expert block i. Under sequence parallelism rank (dp, tp) routes its tp-th token slice, so the FFN ranks
  // of tp coordinate t serve the attention ranks of coordinate t. p2p_peer(rank, peer_pp) is one of them.
  std::vector<int> m2n_peers(int rank, int peer_pp) const;
  // Members of `rank`'s group over a collective's axis, ascending (rank included):
  //   "tp": same pp and dp;  "dp": same pp and tp;  "ep": same pp, tp and ep block (dp / mesh.ep);
  //   "edp": same pp, ep coordinate and expert slice (tp mod mesh.etp): the ranks holding the same expert slice,
  //   tp ranks included (MeshInfo::expert_replicas members);  "etp": same pp and dp, tp / mesh.etp (the ranks that
  //   slice the same experts);  "pp": same dp and tp.
  // Unknown axes give an error naming them.
  Result<std::vector<int>> group_ranks(int rank, const std::string& axis) const;
};

// FNV-1a 64 (base/hash.h) of plan.to_json().dump(): equal plans hash equal. The ranks of a run compare it (runtime
// DistContext) and `piper train` reports it beside the hash of the plan its prediction simulated.
uint64_t plan_hash(const Plan& plan);

// Called once per lowered node instruction to fill or overwrite its cost annotations (flops, bytes, comm_bytes),
// from the instruction's own fields: op, pass, part, segment, pieces and comm_bytes (the node's payload per rank,
// filled before the call).
using CostFn = std::function<void(Instruction& instr)>;

}  // namespace piper::compile
