#include "piper/compile/plan.h"

#include <algorithm>

#include "piper/base/hash.h"

namespace piper::compile {

size_t Program::num_instructions() const {
  size_t n = 0;
  for (const auto& s : streams) n += s.instrs.size();
  return n;
}

const char* to_string(CommRole r) {
  switch (r) {
    case CommRole::kNone:
      return "none";
    case CommRole::kPipeline:
      return "pipeline";
    case CommRole::kGradReduce:
      return "grad_reduce";
    case CommRole::kParamGather:
      return "param_gather";
    case CommRole::kTpGather:
      return "tp_gather";
    case CommRole::kTpScatter:
      return "tp_scatter";
    case CommRole::kTpReduce:
      return "tp_reduce";
    case CommRole::kEpDispatch:
      return "ep_dispatch";
    case CommRole::kEpCombine:
      return "ep_combine";
    case CommRole::kEtpGather:
      return "etp_gather";
    case CommRole::kEtpScatter:
      return "etp_scatter";
    case CommRole::kM2NToExperts:
      return "m2n_to_experts";
    case CommRole::kM2NFromExperts:
      return "m2n_from_experts";
    case CommRole::kM2NDense:
      return "m2n_dense";
    case CommRole::kTpGradSum:
      return "tp_grad_sum";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::kCompute:
      return "compute";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kCollective:
      return "collective";
    case OpKind::kRecord:
      return "record";
    case OpKind::kWait:
      return "wait";
    case OpKind::kAlloc:
      return "alloc";
    case OpKind::kFree:
      return "free";
    case OpKind::kUpdate:
      return "update";
  }
  return "?";
}

const char* to_string(Segment s) {
  switch (s) {
    case Segment::kWhole:
      return "whole";
    case Segment::kIn:
      return "in";
    case Segment::kRest:
      return "rest";
    case Segment::kOut:
      return "out";
  }
  return "?";
}

Json Plan::to_json() const {
  Json programs = Json::array();
  for (const Program& p : templates) {
    Json streams = Json::array();
    for (const Stream& s : p.streams) {
      Json instrs = Json::array();
      for (const Instruction& in : s.instrs) {
        // Fields at their default value are left out (compile/plan_io.h reads them back as the default).
        Json j = {{"op", to_string(in.op)}, {"label", in.label}};
        if (in.mb >= 0) j["mb"] = in.mb;
        if (in.pass != ir::Pass::kNone) j["pass"] = ir::to_string(in.pass);
        if (in.layer >= 0) j["layer"] = in.layer;
        if (const std::string part = in.part_name(); !part.empty()) j["part"] = part;
        if (in.comm != ir::NodeKind::kChunk) j["comm"] = ir::to_string(in.comm);
        if (in.role != CommRole::kNone) j["role"] = to_string(in.role);
        if (!in.group.empty()) j["group"] = in.group;
        if (!in.algorithm.empty()) j["algorithm"] = in.algorithm;
        if (in.node != ir::kNoNode) j["node"] = in.node;
        if (in.peer >= 0) j["peer"] = in.peer;
        if (in.tag >= 0) j["tag"] = in.tag;
        if (in.event >= 0) j["event"] = in.event;
        if (in.buffer >= 0) j["buffer"] = in.buffer;
        if (in.flops) j["flops"] = in.flops;
        if (in.bytes) j["bytes"] = in.bytes;
        if (in.comm_bytes) j["comm_bytes"] = in.comm_bytes;
        if (in.mem_delta) j["mem_delta"] = in.mem_delta;
        if (in.segment != Segment::kWhole) {
          j["segment"] = to_string(in.segment);
          if (in.segment == Segment::kRest) {
            j["split_in"] = in.split_in;
            j["split_out"] = in.split_out;
          } else {
            j["pieces"] = in.pieces;
          }
        }
        if (!in.inputs.empty()) j["inputs"] = in.inputs;
        if (!in.outputs.empty()) j["outputs"] = in.outputs;
        if (in.recompute) j["recompute"] = true;
        if (in.recompute_norm) j["recompute_norm"] = true;
        if (in.recompute_act) j["recompute_act"] = true;
        if (!in.shard_axis.empty()) j["shard_axis"] = in.shard_axis;
        if (in.src_part) j["src_part"] = chunk_name(*in.src_part);
        if (in.dst_part) j["dst_part"] = chunk_name(*in.dst_part);
        if (in.experts_layer >= 0) j["experts_layer"] = in.experts_layer;
        if (in.combine_on_ffn) j["combine_on_ffn"] = true;
        instrs.push_back(std::move(j));
      }
      streams.push_back(Json{{"name", s.name}, {"instructions", instrs}});
    }
    programs.push_back(Json{{"pp_rank", p.pp_rank}, {"static_bytes", p.static_bytes}, {"streams", streams}});
  }
  Json coord_list = Json::array();
  for (const RankCoord& c : coords) coord_list.push_back(Json::array({c.pp, c.dp, c.ep, c.tp}));
  Json mesh_json{{"pp", mesh.pp}, {"vpp", mesh.vpp}, {"dp", mesh.dp},
                 {"ep", mesh.ep}, {"tp", mesh.tp},   {"fold", mesh.fold}};
  if (mesh.stages > 0) mesh_json["stages"] = mesh.stages;  // absent otherwise: earlier plans keep their hash
  if (mesh.etp > 1) mesh_json["etp"] = mesh.etp;           // likewise
  Json j{{"format", kPlanFormat},
              {"version", kPlanFormatVersion},
              {"world_size", world_size},
              {"num_microbatches", num_microbatches},
              {"num_layers", num_layers},
              {"mesh", mesh_json},
              {"rank_template", rank_template},
              {"coords", coord_list},  // [pp, dp, ep, tp] per global rank
              {"programs", programs}};
  if (sequence_parallel) j["sequence_parallel"] = true;  // absent otherwise: earlier plans keep their hash
  return j;
}

int Plan::rank_of(const RankCoord& c) const {
  return (c.pp * std::max(1, mesh.dp) + c.dp) * std::max(1, mesh.tp) + c.tp;
}

int Plan::p2p_peer(int rank, int peer_pp) const {
  RankCoord c = coords[static_cast<size_t>(rank)];
  c.pp = peer_pp;
  return rank_of(c);
}

std::vector<int> Plan::m2n_peers(int rank, int peer_pp) const {
  const RankCoord& me = coords[static_cast<size_t>(rank)];
  const int slice = std::max(1, mesh.dp) * std::max(1, mesh.tp);
  std::vector<int> out;
  for (int r = peer_pp * slice; r < (peer_pp + 1) * slice && r < world_size; ++r) {
    const RankCoord& c = coords[static_cast<size_t>(r)];
    if (c.tp == me.tp && mesh.ep_block(c.dp, c.tp) == mesh.ep_block(me.dp, me.tp)) out.push_back(r);
  }
  return out;
}

Result<std::vector<int>> Plan::group_ranks(int rank, const std::string& axis) const {
  if (rank < 0 || rank >= world_size) {
    return invalid_argument("rank " + std::to_string(rank) + " is outside the plan's world of " +
                            std::to_string(world_size));
  }
  const RankCoord me = coords[static_cast<size_t>(rank)];
  // Every group but pp lies inside the rank's pipeline stage, whose ranks are contiguous (rank_of).
  const int slice = std::max(1, mesh.dp) * std::max(1, mesh.tp);
  const int etp = std::max(1, mesh.etp);
  const int lo = axis == "pp" ? 0 : me.pp * slice, hi = axis == "pp" ? world_size : lo + slice;
  std::vector<int> out;
  for (int r = lo; r < hi; ++r) {
    const RankCoord& c = coords[static_cast<size_t>(r)];
    bool member = false;
    if (axis == "tp") {
      member = c.pp == me.pp && c.dp == me.dp;
    } else if (axis == "dp") {
      member = c.pp == me.pp && c.tp == me.tp;
    } else if (axis == "ep") {
      member = c.pp == me.pp && mesh.ep_block(c.dp, c.tp) == mesh.ep_block(me.dp, me.tp);
    } else if (axis == "edp") {
      // Every tp rank with the same expert slice too (MeshInfo::expert_replicas).
      member = c.pp == me.pp && c.ep == me.ep && c.tp % etp == me.tp % etp;
    } else if (axis == "etp") {
      member = c.pp == me.pp && c.dp == me.dp && c.tp / etp == me.tp / etp;
    } else if (axis == "pp") {
      member = c.dp == me.dp && c.tp == me.tp;
    } else {
      return invalid_argument("group axis '" + axis + "' is not one of tp, dp, ep, edp, etp, pp");
    }
    if (member) out.push_back(r);
  }
  return out;
}

uint64_t plan_hash(const Plan& plan) {
  // This basis (not FNV's 14695981039346656037) is the one plan hashes have always used: kept so they stay equal.
  const std::string text = plan.to_json().dump();
  return fnv1a64(text.data(), text.size(), 1469598103934665603ull);
}

}  // namespace piper::compile
