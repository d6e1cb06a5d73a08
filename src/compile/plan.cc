#include "piper/compile/plan.h"

namespace piper::compile {

size_t Program::num_instructions() const {
  size_t n = 0;
  for (const auto& s : streams) n += s.instrs.size();
  return n;
}

Json Plan::to_json() const {
  Json programs = Json::array();
  for (const Program& p : templates) {
    Json streams = Json::array();
    for (const Stream& s : p.streams) {
      Json instrs = Json::array();
      for (const Instruction& in : s.instrs) {
        Json j = {{"op", to_string(in.op)}, {"label", in.label}};
        if (in.mb >= 0) j["mb"] = in.mb;
        if (in.pass != ir::Pass::kNone) j["pass"] = ir::to_string(in.pass);
        if (in.op == OpKind::kCollective || in.op == OpKind::kSend || in.op == OpKind::kRecv) {
          j["comm"] = ir::to_string(in.comm);
          if (!in.group.empty()) j["group"] = in.group;
          if (!in.algorithm.empty()) j["algorithm"] = in.algorithm;
        }
        if (in.node != ir::kNoNode) j["node"] = in.node;
        if (in.peer >= 0) j["peer"] = in.peer;
        if (in.tag >= 0) j["tag"] = in.tag;
        if (in.event >= 0) j["event"] = in.event;
        if (in.buffer >= 0) j["buffer"] = in.buffer;
        if (in.flops) j["flops"] = in.flops;
        if (in.bytes) j["bytes"] = in.bytes;
        if (in.comm_bytes) j["comm_bytes"] = in.comm_bytes;
        if (in.mem_delta) j["mem_delta"] = in.mem_delta;
        instrs.push_back(std::move(j));
      }
      streams.push_back(Json{{"name", s.name}, {"instructions", instrs}});
    }
    programs.push_back(Json{{"pp_rank", p.pp_rank}, {"static_bytes", p.static_bytes}, {"streams", streams}});
  }
  Json coord_list = Json::array();
  for (const RankCoord& c : coords) coord_list.push_back(Json::array({c.pp, c.dp, c.ep, c.tp}));
  return Json{{"world_size", world_size},
              {"mesh", Json{{"pp", mesh.pp}, {"vpp", mesh.vpp}, {"dp", mesh.dp}, {"ep", mesh.ep}, {"tp", mesh.tp}}},
              {"rank_template", rank_template},
              {"coords", coord_list},  // [pp, dp, ep, tp] per global rank
              {"programs", programs}};
}

}  // namespace piper::compile
