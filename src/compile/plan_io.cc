#include "piper/compile/plan_io.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "piper/base/files.h"
#include "piper/compile/verify_plan.h"
#include "piper/spec/limits.h"

namespace piper::compile {
namespace {

// Bounds on a file's numbers, so that no sum an executor or the verifier forms can overflow: a byte count or memory
// delta of one instruction is at most a pebibyte (2^50; no device holds one), a program's memory deltas add up
// to at most 2^62 in magnitude, and a tag (the compiler numbers point-to-point pairs by node) at most 2^40, as the
// verifier keys pairs by tag * pipeline ranks + rank.
constexpr int64_t kMaxBytes = int64_t{1} << 50;
constexpr int64_t kMaxProgramDeltas = int64_t{1} << 62;
constexpr int64_t kMaxTag = int64_t{1} << 40;

// The name of every value of an enum (to_string over its range), for parsing it back.
template <typename E>
std::vector<std::string> names_of(int count) {
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) out.emplace_back(to_string(static_cast<E>(i)));
  return out;
}

template <typename E, typename ToString>
Status get_enum(JsonReader& r, const std::string& key, E* out, const std::vector<std::string>& names, ToString to_name,
                bool required) {
  std::string text = required ? "" : to_name(*out);
  PIPER_RETURN_IF_ERROR(r.get_enum(key, &text, names, required));
  *out = static_cast<E>(std::find(names.begin(), names.end(), text) - names.begin());
  return ok_status();
}

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> v = names_of<OpKind>(static_cast<int>(OpKind::kUpdate) + 1);
  return v;
}
const std::vector<std::string>& role_names() {
  static const std::vector<std::string> v = names_of<CommRole>(static_cast<int>(CommRole::kTpGradSum) + 1);
  return v;
}
const std::vector<std::string>& segment_names() {
  static const std::vector<std::string> v = names_of<Segment>(static_cast<int>(Segment::kOut) + 1);
  return v;
}
const std::vector<std::string>& pass_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (int i = 0; i <= static_cast<int>(ir::Pass::kU); ++i) out.emplace_back(ir::to_string(static_cast<ir::Pass>(i)));
    return out;
  }();
  return v;
}
const std::vector<std::string>& kind_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (int i = 0; i <= static_cast<int>(ir::NodeKind::kUpdate); ++i)
      out.emplace_back(ir::to_string(static_cast<ir::NodeKind>(i)));
    return out;
  }();
  return v;
}

bool is_transfer(OpKind op) { return op == OpKind::kSend || op == OpKind::kRecv; }

// What the op needs beyond the common fields: a peer and tag (send/recv), a known collective over a known axis, an
// event (record/wait), a buffer (alloc/free).
Status check_op(const Instruction& in, const std::string& where, int pp) {
  const std::string op = to_string(in.op);
  if (is_transfer(in.op)) {
    if (in.peer < 0 || in.peer >= pp || in.tag < 0) {
      return invalid_argument(where + ": a " + op + " needs \"peer\" (a pipeline rank in [0, " + std::to_string(pp) +
                              ")) and \"tag\" (>= 0); got peer " + std::to_string(in.peer) + ", tag " +
                              std::to_string(in.tag));
    }
    if (in.comm != ir::NodeKind::kSend && in.comm != ir::NodeKind::kRecv && in.comm != ir::NodeKind::kM2N) {
      return invalid_argument(where + ": a " + op + " has \"comm\" send, recv or m2n, not " + ir::to_string(in.comm));
    }
  }
  if (in.op == OpKind::kCollective) {
    if (!ir::is_collective(in.comm) || in.comm == ir::NodeKind::kM2N) {
      return invalid_argument(where +
                              ": a collective has \"comm\" all_reduce, reduce_scatter, all_gather or "
                              "all_to_all, not " +
                              std::string(ir::to_string(in.comm)));
    }
    static const std::set<std::string> axes = {"tp", "dp", "ep", "edp", "etp", "pp"};
    if (axes.count(in.group) == 0) {
      return invalid_argument(where + ": group '" + in.group + "' is not one of tp, dp, ep, edp, etp, pp");
    }
    // A tp_overlap all-gather's ring step passes its shard point to point, on the tag the compiler gave its ring.
    if (in.algorithm == "ring_step" && (in.tag < 0 || in.tag > 32767)) {
      return invalid_argument(where + ": a ring_step piece needs \"tag\" in [0, 32767] (its ring's point-to-point " +
                              "tag); got " + std::to_string(in.tag));
    }
  }
  if ((in.op == OpKind::kRecord || in.op == OpKind::kWait) && in.event < 0) {
    return invalid_argument(where + ": a " + op + " needs \"event\" (>= 0)");
  }
  if ((in.op == OpKind::kAlloc || in.op == OpKind::kFree) && in.buffer < 0) {
    return invalid_argument(where + ": a " + op + " needs \"buffer\" (>= 0)");
  }
  return ok_status();
}

// Instruction::inputs / outputs: node ids (each checked against the program's nodes by check_dataflow).
Status node_list_from_json(JsonReader& r, const std::string& key, std::vector<ir::NodeId>* out) {
  const Json* v = r.find(key);
  if (v == nullptr) return ok_status();
  if (!v->is_array()) return invalid_argument(r.field_path(key) + ": expected an array of node ids");
  for (const Json& id : *v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxGraphNodes) {
      return invalid_argument(r.field_path(key) + ": " + id.dump() + " is not a node id (an integer in [0, " +
                              std::to_string(kMaxGraphNodes) + "))");
    }
    out->push_back(static_cast<ir::NodeId>(id.get<int64_t>()));
  }
  return ok_status();
}

// An optional chunk part, read by its name (spec/part.h); an unknown name is refused with the names there are.
Status chunk_part_from_json(JsonReader& r, const std::string& key, std::optional<Part>* out) {
  std::string name;
  PIPER_RETURN_IF_ERROR(r.get_string(key, &name, false));
  if (!r.has(key)) return ok_status();
  PIPER_ASSIGN_OR_RETURN(Part p, parse_chunk_part(name, r.field_path(key)));
  *out = p;
  return ok_status();
}

// "part": a compute's or update's chunk part, or a communication's chunk part or node tag (Instruction::comm_part).
Status part_from_json(JsonReader& r, Instruction& in) {
  if (in.op == OpKind::kCompute || in.op == OpKind::kUpdate) return chunk_part_from_json(r, "part", &in.part);
  std::string name;
  PIPER_RETURN_IF_ERROR(r.get_string("part", &name, false));
  in.part = chunk_part(name);
  if (!in.part) in.comm_part = name;
  return ok_status();
}

// What executors read instead of the graph (plan.h, "Data flow").
Status dataflow_from_json(JsonReader& r, Instruction& in) {
  PIPER_RETURN_IF_ERROR(node_list_from_json(r, "inputs", &in.inputs));
  PIPER_RETURN_IF_ERROR(node_list_from_json(r, "outputs", &in.outputs));
  PIPER_RETURN_IF_ERROR(r.get_bool("recompute", &in.recompute, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("recompute_norm", &in.recompute_norm, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("recompute_act", &in.recompute_act, false));
  static const std::vector<std::string> axes = {"tp", "ep"};
  if (r.has("shard_axis")) PIPER_RETURN_IF_ERROR(r.get_enum("shard_axis", &in.shard_axis, axes, false));
  PIPER_RETURN_IF_ERROR(chunk_part_from_json(r, "src_part", &in.src_part));
  PIPER_RETURN_IF_ERROR(chunk_part_from_json(r, "dst_part", &in.dst_part));
  PIPER_RETURN_IF_ERROR(r.get_int("experts_layer", &in.experts_layer, false, -1, static_cast<int>(kMaxLayers) - 1));
  PIPER_RETURN_IF_ERROR(r.get_bool("combine_on_ffn", &in.combine_on_ffn, false));
  if (in.comm != ir::NodeKind::kM2N && (in.src_part || in.dst_part || in.experts_layer >= 0 || in.combine_on_ffn)) {
    return invalid_argument(r.field_path("src_part") + ": src_part, dst_part, experts_layer and combine_on_ffn " +
                            "belong to m2n instructions; this one has comm " + ir::to_string(in.comm));
  }
  if (in.comm == ir::NodeKind::kM2N && in.node != ir::kNoNode && (!in.src_part || !in.dst_part)) {
    return invalid_argument(r.field_path("src_part") + ": an m2n instruction names the parts of both ends " +
                            "(src_part and dst_part); emit the plan again with piper compile --emit-plan");
  }
  return ok_status();
}

Result<Instruction> instruction_from_json(const Json& j, const std::string& where, int pp) {
  if (!j.is_object()) return invalid_argument(where + ": expected an instruction object");
  JsonReader r(j, where);
  Instruction in;
  PIPER_RETURN_IF_ERROR(get_enum(
      r, "op", &in.op, op_names(), [](OpKind k) { return to_string(k); }, true));
  PIPER_RETURN_IF_ERROR(r.get_string("label", &in.label, true));
  PIPER_RETURN_IF_ERROR(get_enum(
      r, "pass", &in.pass, pass_names(), [](ir::Pass p) { return ir::to_string(p); }, false));
  PIPER_RETURN_IF_ERROR(r.get_int("mb", &in.mb, false, -1));
  PIPER_RETURN_IF_ERROR(r.get_int("layer", &in.layer, false, -1, static_cast<int>(kMaxLayers)));
  PIPER_RETURN_IF_ERROR(part_from_json(r, in));
  PIPER_RETURN_IF_ERROR(get_enum(
      r, "comm", &in.comm, kind_names(), [](ir::NodeKind k) { return ir::to_string(k); }, false));
  PIPER_RETURN_IF_ERROR(get_enum(
      r, "role", &in.role, role_names(), [](CommRole k) { return to_string(k); }, false));
  PIPER_RETURN_IF_ERROR(r.get_string("group", &in.group, false));
  PIPER_RETURN_IF_ERROR(r.get_string("algorithm", &in.algorithm, false));
  PIPER_RETURN_IF_ERROR(r.get_int("node", &in.node, false, -1));
  PIPER_RETURN_IF_ERROR(r.get_int("peer", &in.peer, false, -1));
  PIPER_RETURN_IF_ERROR(r.get_int("tag", &in.tag, false, -1, kMaxTag));
  PIPER_RETURN_IF_ERROR(r.get_int("event", &in.event, false, -1));
  PIPER_RETURN_IF_ERROR(r.get_int("buffer", &in.buffer, false, -1));
  PIPER_RETURN_IF_ERROR(r.get_int("flops", &in.flops, false, 0));
  PIPER_RETURN_IF_ERROR(r.get_int("bytes", &in.bytes, false, 0, kMaxBytes));
  PIPER_RETURN_IF_ERROR(r.get_int("comm_bytes", &in.comm_bytes, false, 0, kMaxBytes));
  PIPER_RETURN_IF_ERROR(r.get_int("mem_delta", &in.mem_delta, false, -kMaxBytes, kMaxBytes));
  PIPER_RETURN_IF_ERROR(get_enum(
      r, "segment", &in.segment, segment_names(), [](Segment s) { return to_string(s); }, false));
  PIPER_RETURN_IF_ERROR(r.get_int("pieces", &in.pieces, false, 1, 1 << 16));
  PIPER_RETURN_IF_ERROR(r.get_bool("split_in", &in.split_in, false));
  PIPER_RETURN_IF_ERROR(r.get_bool("split_out", &in.split_out, false));
  PIPER_RETURN_IF_ERROR(dataflow_from_json(r, in));
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  PIPER_RETURN_IF_ERROR(check_op(in, where, pp));
  return in;
}

// The array under `key` of object reader `r`, or an error naming it.
Result<const Json*> get_array(JsonReader& r, const std::string& key) {
  const Json* v = r.find(key);
  if (v == nullptr || !v->is_array()) {
    return invalid_argument(r.field_path(key) + ": required field is missing or not an array");
  }
  return v;
}

// Every waited event of a program is recorded in it (a wait for an event no stream records blocks forever).
Status check_events(const Program& prog, const std::string& where) {
  std::set<int> recorded;
  for (const Stream& s : prog.streams) {
    for (const Instruction& in : s.instrs) {
      if (in.op == OpKind::kRecord) recorded.insert(in.event);
    }
  }
  for (const Stream& s : prog.streams) {
    for (const Instruction& in : s.instrs) {
      if (in.op == OpKind::kWait && recorded.count(in.event) == 0) {
        return invalid_argument(where + " stream '" + s.name + "': '" + in.label + "' waits for event " +
                                std::to_string(in.event) + ", which no instruction of this program records");
      }
    }
  }
  return ok_status();
}

// Every instruction's microbatch and layers lie inside the plan's, and every node its data flow names is lowered
// by an instruction of the same program (messages never cross ranks without a send/recv or m2n pair).
Status check_dataflow(const Program& prog, const std::string& where, int num_mb, int num_layers) {
  std::set<ir::NodeId> nodes;
  for (const Stream& s : prog.streams) {
    for (const Instruction& in : s.instrs) nodes.insert(in.node);
  }
  for (const Stream& s : prog.streams) {
    for (const Instruction& in : s.instrs) {
      const std::string what = where + " stream '" + s.name + "': '" + in.label + "'";
      if (in.mb >= num_mb || in.layer >= num_layers || in.experts_layer >= num_layers) {
        return invalid_argument(what + " names microbatch " + std::to_string(in.mb) + ", layer " +
                                std::to_string(std::max(in.layer, in.experts_layer)) + "; the plan has " +
                                std::to_string(num_mb) + " microbatches and " + std::to_string(num_layers) +
                                " layers (num_microbatches, num_layers)");
      }
      for (const auto* list : {&in.inputs, &in.outputs}) {
        for (ir::NodeId id : *list) {
          if (in.node == ir::kNoNode || nodes.count(id) == 0) {
            return invalid_argument(what + " exchanges messages with node " + std::to_string(id) +
                                    ", which no instruction of this program lowers" +
                                    (in.node == ir::kNoNode ? " (and it lowers no node itself)" : ""));
          }
        }
      }
    }
  }
  return ok_status();
}

// Plan::sequence_parallel against the programs: it needs tp > 1, and a tp reduce-scatter of a chunk's output
// (CommRole::kTpScatter) exists only under it.
Status check_sequence_parallel(const Plan& plan, const std::string& where) {
  if (plan.sequence_parallel && plan.mesh.tp <= 1) {
    return invalid_argument(where + ": true needs tp > 1 (mesh tp=" + std::to_string(plan.mesh.tp) +
                            "); drop it or emit the plan again");
  }
  if (plan.sequence_parallel) return ok_status();
  for (const Program& prog : plan.templates) {
    for (const Stream& st : prog.streams) {
      for (const Instruction& in : st.instrs) {
        if (in.role != CommRole::kTpScatter) continue;
        return invalid_argument(where + ": the plan reduce-scatters '" + in.label +
                                "' over tp (sequence parallelism) but does not set sequence_parallel; emit the plan "
                                "again with this piper");
      }
    }
  }
  return ok_status();
}

Result<Program> program_from_json(const Json& j, const std::string& where, int pp, int num_mb, int num_layers) {
  if (!j.is_object()) return invalid_argument(where + ": expected a program object");
  JsonReader r(j, where);
  Program prog;
  PIPER_RETURN_IF_ERROR(r.get_int("pp_rank", &prog.pp_rank, true, 0, pp - 1));
  PIPER_RETURN_IF_ERROR(r.get_int("static_bytes", &prog.static_bytes, true, 0, kMaxBytes));
  PIPER_ASSIGN_OR_RETURN(const Json* streams, get_array(r, "streams"));
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  for (size_t s = 0; s < streams->size(); ++s) {
    const std::string sw = where + ".streams[" + std::to_string(s) + "]";
    if (!(*streams)[s].is_object()) return invalid_argument(sw + ": expected a stream object");
    JsonReader sr((*streams)[s], sw);
    Stream st;
    PIPER_RETURN_IF_ERROR(sr.get_string("name", &st.name, true));
    PIPER_ASSIGN_OR_RETURN(const Json* instrs, get_array(sr, "instructions"));
    PIPER_RETURN_IF_ERROR(sr.check_no_unknown_keys());
    st.instrs.reserve(instrs->size());
    for (size_t i = 0; i < instrs->size(); ++i) {
      PIPER_ASSIGN_OR_RETURN(Instruction in,
                             instruction_from_json((*instrs)[i], sw + ".instructions[" + std::to_string(i) + "]", pp));
      st.instrs.push_back(std::move(in));
    }
    prog.streams.push_back(std::move(st));
  }
  PIPER_RETURN_IF_ERROR(check_events(prog, where));
  PIPER_RETURN_IF_ERROR(check_dataflow(prog, where, num_mb, num_layers));
  int64_t deltas = 0;
  for (const Stream& st : prog.streams) {
    for (const Instruction& in : st.instrs) {
      deltas += in.mem_delta < 0 ? -in.mem_delta : in.mem_delta;
      if (deltas > kMaxProgramDeltas) {
        return invalid_argument(where + ": the memory deltas add up to more than 2^62 bytes; not a plan's");
      }
    }
  }
  return prog;
}

Result<ir::MeshInfo> mesh_from_json(JsonReader& top) {
  const Json* m = top.find("mesh");
  if (m == nullptr || !m->is_object()) return invalid_argument(top.field_path("mesh") + ": required object is missing");
  JsonReader r(*m, top.field_path("mesh"));
  ir::MeshInfo mesh;
  const int most = static_cast<int>(kMaxWorldSize);
  for (auto [key, out] :
       {std::pair{"pp", &mesh.pp}, {"vpp", &mesh.vpp}, {"dp", &mesh.dp}, {"ep", &mesh.ep}, {"tp", &mesh.tp}}) {
    PIPER_RETURN_IF_ERROR(r.get_int(key, out, true, 1, most));
  }
  PIPER_RETURN_IF_ERROR(r.get_bool("fold", &mesh.fold, true));
  // Written only when the stages are not pp*vpp (uneven af-pipe splits, MeshInfo::stages).
  PIPER_RETURN_IF_ERROR(r.get_int("stages", &mesh.stages, false, 1, static_cast<int>(2 * kMaxLayers)));
  // Written only when > 1 (MeshInfo::etp).
  PIPER_RETURN_IF_ERROR(r.get_int("etp", &mesh.etp, false, 1, most));
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  if (mesh.tp % mesh.etp != 0 || (mesh.fold && mesh.etp > 1)) {
    return invalid_argument(r.field_path("etp") + ": etp=" + std::to_string(mesh.etp) +
                            " must divide tp=" + std::to_string(mesh.tp) + " and needs fold=false");
  }
  const int64_t expert_ranks = mesh.fold ? int64_t{mesh.dp} * mesh.tp : mesh.dp;
  if (expert_ranks % mesh.ep != 0) {
    return invalid_argument(r.field_path("ep") + ": ep=" + std::to_string(mesh.ep) + " does not divide " +
                            (mesh.fold ? "dp*tp" : "dp") + "=" + std::to_string(expert_ranks));
  }
  return mesh;
}

// rank_template and coords: one entry per global rank, laid out as Plan::rank_of says.
Status ranks_from_json(JsonReader& top, Plan& plan) {
  PIPER_ASSIGN_OR_RETURN(const Json* templates, get_array(top, "rank_template"));
  PIPER_ASSIGN_OR_RETURN(const Json* coords, get_array(top, "coords"));
  const auto n = static_cast<size_t>(plan.world_size);
  if (templates->size() != n || coords->size() != n) {
    return invalid_argument(top.field_path("rank_template") + " and coords: expected one entry per rank (" +
                            std::to_string(n) + "), got " + std::to_string(templates->size()) + " and " +
                            std::to_string(coords->size()));
  }
  const ir::MeshInfo& m = plan.mesh;
  for (size_t rank = 0; rank < n; ++rank) {
    const Json& t = (*templates)[rank];
    const Json& c = (*coords)[rank];
    const std::string where = top.field_path("coords") + "[" + std::to_string(rank) + "]";
    if (!c.is_array() || c.size() != 4 || !std::all_of(c.begin(), c.end(), [](const Json& v) {
          return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < kMaxWorldSize;
        })) {
      return invalid_argument(where + ": expected [pp, dp, ep, tp], four integers >= 0");
    }
    const RankCoord rc{c[0].get<int>(), c[1].get<int>(), c[2].get<int>(), c[3].get<int>()};
    if (rc.pp >= m.pp || rc.dp >= m.dp || rc.tp >= m.tp || rc.ep != m.ep_coord(rc.dp, rc.tp) ||
        plan.rank_of(rc) != static_cast<int>(rank)) {
      return invalid_argument(where + ": " + c.dump() + " is not rank " + std::to_string(rank) +
                              "'s coordinates on this mesh (rank = (pp*dp + dp_c)*tp + tp_c)");
    }
    if (!t.is_number_integer() || t.get<int64_t>() != rc.pp) {
      return invalid_argument(top.field_path("rank_template") + "[" + std::to_string(rank) + "]: expected " +
                              std::to_string(rc.pp) + " (the rank's pipeline rank), got " + t.dump());
    }
    plan.coords.push_back(rc);
    plan.rank_template.push_back(rc.pp);
  }
  return ok_status();
}

}  // namespace

Result<Plan> plan_from_json(const Json& j, const std::string& what) {
  if (!j.is_object()) return invalid_argument(what + ": expected a JSON object (a plan file)");
  JsonReader r(j, what);
  std::string format;
  PIPER_RETURN_IF_ERROR(r.get_string("format", &format, true));
  if (format != kPlanFormat) {
    return invalid_argument(what + ": format '" + format + "' is not a Piper plan (" + kPlanFormat +
                            "); write one with piper compile --emit-plan FILE");
  }
  int version = 0;
  PIPER_RETURN_IF_ERROR(r.get_int("version", &version, true));
  if (version != kPlanFormatVersion) {
    return invalid_argument(what + ": plan format version " + std::to_string(version) + " is not the version " +
                            std::to_string(kPlanFormatVersion) + " this piper reads; emit the plan again with it");
  }
  Plan plan;
  PIPER_ASSIGN_OR_RETURN(plan.mesh, mesh_from_json(r));
  PIPER_RETURN_IF_ERROR(r.get_int("world_size", &plan.world_size, true, 1, static_cast<int>(kMaxWorldSize)));
  const int64_t world = int64_t{plan.mesh.pp} * plan.mesh.dp * plan.mesh.tp;
  if (world != plan.world_size) {
    return invalid_argument(r.field_path("world_size") + ": " + std::to_string(plan.world_size) +
                            " is not pp*dp*tp = " + std::to_string(world));
  }
  PIPER_RETURN_IF_ERROR(
      r.get_int("num_microbatches", &plan.num_microbatches, true, 1, static_cast<int>(kMaxMicrobatches)));
  PIPER_RETURN_IF_ERROR(r.get_int("num_layers", &plan.num_layers, true, 1, static_cast<int>(kMaxLayers)));
  PIPER_RETURN_IF_ERROR(r.get_bool("sequence_parallel", &plan.sequence_parallel, false));
  PIPER_RETURN_IF_ERROR(ranks_from_json(r, plan));
  PIPER_ASSIGN_OR_RETURN(const Json* programs, get_array(r, "programs"));
  PIPER_RETURN_IF_ERROR(r.check_no_unknown_keys());
  if (programs->size() != static_cast<size_t>(plan.mesh.pp)) {
    return invalid_argument(r.field_path("programs") + ": expected one program per pipeline rank (" +
                            std::to_string(plan.mesh.pp) + "), got " + std::to_string(programs->size()));
  }
  for (size_t p = 0; p < programs->size(); ++p) {
    const std::string where = r.field_path("programs") + "[" + std::to_string(p) + "]";
    PIPER_ASSIGN_OR_RETURN(Program prog, program_from_json((*programs)[p], where, plan.mesh.pp,
                                                           plan.num_microbatches, plan.num_layers));
    if (prog.pp_rank != static_cast<int>(p)) {
      return invalid_argument(where + ".pp_rank: " + std::to_string(prog.pp_rank) + " (programs are in pipeline " +
                              "rank order; expected " + std::to_string(p) + ")");
    }
    plan.templates.push_back(std::move(prog));
  }
  PIPER_RETURN_IF_ERROR(check_sequence_parallel(plan, r.field_path("sequence_parallel")));
  // What the compiler checked before writing it: matched sends and receives, no deadlock (compile/verify_plan.h).
  auto verified = verify_plan(plan);
  if (!verified.ok()) return invalid_argument(what + ": " + verified.status().message());
  return plan;
}

Result<Plan> load_plan_file(const std::string& path) {
  PIPER_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, "plan file"));
  PIPER_ASSIGN_OR_RETURN(Json j, parse_json(text, path));
  return plan_from_json(j, path);
}

Status write_plan_file(const std::string& path, const Plan& plan) {
  return write_file_atomic(path, plan.to_json().dump() + "\n");
}

}  // namespace piper::compile
