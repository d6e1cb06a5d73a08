// Plan files (compile/plan_io.h): a compiled plan written as JSON reads back to the same Plan, field for field; a
// damaged file gets an error that names the field and never crashes.
#include "piper/compile/plan_io.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "piper/compile/compile.h"
#include "piper/spec/model_loader.h"
#include "tiny_plan.h"

namespace piper::compile {
namespace {

// Every kind of instruction and field: ZeRO-3 gathers, tp collectives, ep all-to-alls, pipeline p2p, events,
// buffers, updates; af-pipe's m2n; tp_overlap's pieces.
const char* const kStrategies[] = {
    "dp=4,ep=2,tp=2,sp=1,pp=2,zero=3,schedule=1f1b,microbatches=2",
    "dp=4,ep=4,pp=2,schedule=dualpipev,zero=1,microbatches=4",
    "dp=4,ep=2,pp=1,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4,microbatches=2",
    "dp=2,tp=2,sp=1,tp_overlap=1,pp=2,microbatches=2",
};

TEST(PlanIoTest, EveryPlanReadsBackToTheSamePlan) {
  for (const char* text : kStrategies) {
    SCOPED_TRACE(text);
    const Plan plan = compiled(text);
    ASSERT_GT(plan.world_size, 0);
    auto back = plan_from_json(Json::parse(plan.to_json().dump()));
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_TRUE(*back == plan);
    EXPECT_EQ(plan_hash(*back), plan_hash(plan));
  }
}

TEST(PlanIoTest, InstructionsSayWhatTheyMean) {
  const Plan plan = compiled(kStrategies[0]);
  std::set<std::string> roles;
  std::set<Part> parts;
  for (const Program& p : plan.templates) {
    for (const Stream& s : p.streams) {
      for (const Instruction& in : s.instrs) {
        roles.insert(to_string(in.role));
        if (in.op == OpKind::kCompute) {
          ASSERT_TRUE(in.part.has_value()) << in.label;
          parts.insert(*in.part);
          EXPECT_EQ(in.role, CommRole::kNone) << in.label;
        }
        if (in.op == OpKind::kSend || in.op == OpKind::kRecv) {
          EXPECT_EQ(in.role, CommRole::kPipeline) << in.label;
        }
        if (in.comm == ir::NodeKind::kAllToAll) {
          EXPECT_TRUE(in.role == CommRole::kEpDispatch || in.role == CommRole::kEpCombine) << in.label;
        }
      }
    }
  }
  for (const char* r :
       {"pipeline", "grad_reduce", "param_gather", "tp_gather", "tp_scatter", "ep_dispatch", "ep_combine"}) {
    EXPECT_EQ(roles.count(r), 1u) << r;
  }
  for (Part p : {Part::kAttention, Part::kRouter, Part::kExperts, Part::kEmbedding, Part::kHead}) {
    EXPECT_EQ(parts.count(p), 1u) << chunk_name(p);
  }
  // af-pipe: every m2n says whether it goes to the experts, comes from them, or neither.
  std::set<CommRole> m2n;
  for (const Program& p : compiled(kStrategies[2]).templates) {
    for (const Stream& s : p.streams) {
      for (const Instruction& in : s.instrs) {
        if (in.comm == ir::NodeKind::kM2N) m2n.insert(in.role);
      }
    }
  }
  EXPECT_EQ(m2n.count(CommRole::kM2NToExperts), 1u);
  EXPECT_EQ(m2n.count(CommRole::kM2NFromExperts), 1u);
}

// What the executors read instead of the graph: each instruction's data flow (messages named by the node of the
// instruction that publishes them, all on its own rank), chunk facts, and the m2n decisions.
TEST(PlanIoTest, InstructionsCarryTheirDataFlow) {
  for (const char* text : kStrategies) {
    SCOPED_TRACE(text);
    const Plan plan = compiled(text);
    EXPECT_GE(plan.num_microbatches, 2);
    EXPECT_GE(plan.num_layers, 2);
    for (const Program& p : plan.templates) {
      std::set<ir::NodeId> nodes;
      for (const Stream& s : p.streams) {
        for (const Instruction& in : s.instrs) nodes.insert(in.node);
      }
      for (const Stream& s : p.streams) {
        for (const Instruction& in : s.instrs) {
          for (ir::NodeId id : in.inputs) EXPECT_EQ(nodes.count(id), 1u) << in.label << " input " << id;
          for (ir::NodeId id : in.outputs) EXPECT_EQ(nodes.count(id), 1u) << in.label << " output " << id;
          // Every forward but the embedding's reads a message; every send sends one; every receive feeds one.
          if (in.op == OpKind::kCompute && in.pass == ir::Pass::kF && in.part != Part::kEmbedding) {
            EXPECT_FALSE(in.inputs.empty()) << in.label;
          }
          if (in.op == OpKind::kSend && in.node != ir::kNoNode) {
            EXPECT_EQ(in.inputs.size(), 1u) << in.label;
          }
          if (in.op == OpKind::kRecv && in.node != ir::kNoNode) {
            EXPECT_FALSE(in.outputs.empty()) << in.label;
          }
          if (in.node == ir::kNoNode) {
            EXPECT_TRUE(in.inputs.empty() && in.outputs.empty()) << in.label;
          }
          if (in.op == OpKind::kCompute && in.part == Part::kExperts && plan.mesh.ep > 1) {
            EXPECT_EQ(in.shard_axis, "ep") << in.label;
          }
        }
      }
    }
  }
  // af-pipe: both ends' parts on every m2n; the experts' layer on those touching the experts; the last layer's
  // experts feed the head on the FFN rank, so its combine runs in the FFN group, while the others' runs on the
  // router's attention rank (one attention pipeline rank).
  std::set<bool> placements;
  for (const Program& p : compiled(kStrategies[2]).templates) {
    for (const Stream& s : p.streams) {
      for (const Instruction& in : s.instrs) {
        if (in.comm != ir::NodeKind::kM2N) {
          EXPECT_TRUE(!in.src_part && in.experts_layer < 0 && !in.combine_on_ffn) << in.label;
          continue;
        }
        EXPECT_FALSE(!in.src_part || !in.dst_part) << in.label;
        const bool experts = in.src_part == Part::kExperts || in.dst_part == Part::kExperts;
        EXPECT_EQ(in.experts_layer >= 0, experts) << in.label;
        EXPECT_EQ(in.role == CommRole::kM2NDense, !experts) << in.label;
        if (experts) placements.insert(in.combine_on_ffn);
      }
    }
  }
  EXPECT_EQ(placements.size(), 2u);
}

// The error plan_from_json gives for `j` (fails the test when it loads).
std::string error_of(const Json& j) {
  auto r = plan_from_json(j, "f.json");
  EXPECT_FALSE(r.ok());
  return r.ok() ? std::string() : r.status().message();
}

Json& first_instruction(Json& j, const std::string& op) {
  for (Json& s : j["programs"][1]["streams"]) {
    for (Json& in : s["instructions"]) {
      if (in["op"] == op) return in;
    }
  }
  ADD_FAILURE() << "no " << op;
  return j;
}

TEST(PlanIoTest, ADamagedFileIsRefusedWithTheField) {
  const Json good = compiled(kStrategies[0]).to_json();
  auto with = [&](auto edit) {
    Json j = good;
    edit(j);
    return error_of(j);
  };
  EXPECT_NE(with([](Json& j) { j["version"] = 1; }).find("version 1"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["format"] = "x"; }).find("--emit-plan"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j.erase("programs"); }).find("f.json.programs"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j.erase("version"); }).find("version: required"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["mesh"]["dp"] = 3; }).find("ep=2 does not divide dp=3"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["world_size"] = 8; }).find("pp*dp*tp"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["rank_template"][3] = 7; }).find("rank_template[3]"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["coords"][5] = Json::array({0, 0, 0, 0}); }).find("coords[5]"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["programs"].erase(1); }).find("one program per pipeline rank"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "send")["peer"] = 2; }).find("peer 2"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "recv").erase("tag"); }).find("\"tag\""), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "collective")["group"] = "xy"; }).find("group 'xy'"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["op"] = "jump"; }).find("instructions["),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["flops"] = -1; }).find("flops"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["lyaer"] = 1; }).find("lyaer"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "wait")["event"] = 1 << 30; }).find("no instruction of this"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "alloc").erase("buffer"); }).find("\"buffer\""), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["programs"][0]["streams"][0] = 5; }).find("stream object"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "send")["tag"] = 1 << 20; }).find("no matching receive"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "send")["tag"] = int64_t{1} << 41; }).find("tag"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "alloc")["mem_delta"] = int64_t{1} << 51; }).find("mem_delta"),
            std::string::npos);
  EXPECT_NE(error_of(Json::array()).find("JSON object"), std::string::npos);
  // The executors' data flow and chunk facts (plan.h, "Data flow").
  EXPECT_NE(with([](Json& j) { j.erase("num_microbatches"); }).find("num_microbatches: required"), std::string::npos);
  EXPECT_NE(with([](Json& j) { j["num_layers"] = 0; }).find("num_layers"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["mb"] = 2; }).find("2 microbatches"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["layer"] = 99; }).find("layer 99"), std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["inputs"] = Json::array({1 << 21}); })
                .find("no instruction of this program lowers"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "send")["inputs"] = "x"; }).find("inputs: expected an array"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "send")["outputs"] = Json::array({-1}); }).find("not a node id"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "alloc")["outputs"] = Json::array({0}); })
                .find("lowers no node itself"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["shard_axis"] = "dp"; }).find("shard_axis"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["combine_on_ffn"] = true; }).find("m2n instructions"),
            std::string::npos);
  EXPECT_NE(with([](Json& j) { first_instruction(j, "compute")["recompute"] = 1; }).find("recompute"),
            std::string::npos);
  // Part names are read once into the enum (spec/part.h): an unknown one is refused with the names there are.
  const std::string bad_part = with([](Json& j) { first_instruction(j, "compute")["part"] = "atn"; });
  EXPECT_NE(bad_part.find("part 'atn' is not a chunk part; use one of embed, attn, router"), std::string::npos)
      << bad_part;
  EXPECT_NE(bad_part.find(".part"), std::string::npos) << bad_part;
}

// Under sequence parallelism the experts' gradients reduce over edp, tensor ranks included
// (ir::MeshInfo::experts_reduce_over_edp): a file that moves them to dp, or drops sequence_parallel from a plan
// that still scatters over tp, is refused with what to do.
// A tensor-parallel plan carries its gradient sums over tp (role "tp_grad_sum") through a file; a file without
// them (written before they were instructions) is refused, naming the chunk and the fix.
TEST(PlanIoTest, TpGradSumsRoundTripAndAreRequired) {
  const Plan plan = compiled("dp=2,tp=2,sp=1,zero=1,microbatches=2");
  const Json good = plan.to_json();
  auto back = plan_from_json(good, "f.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, plan);
  Json j = good;
  size_t dropped = 0;
  for (Json& prog : j["programs"]) {
    // Each sum's readers read what it read, as in a plan without it.
    std::map<int64_t, std::pair<Json, Json>> sums;  // node -> (inputs, outputs)
    for (Json& st : prog["streams"]) {
      for (Json& in : st["instructions"]) {
        if (in.value("role", "") == "tp_grad_sum") sums[in["node"].get<int64_t>()] = {in["inputs"], in["outputs"]};
      }
    }
    auto rewire = [&](Json& ids, bool inputs) {
      Json out = Json::array();
      for (const Json& id : ids) {
        auto s = sums.find(id.get<int64_t>());
        if (s == sums.end()) {
          out.push_back(id);
          continue;
        }
        for (const Json& other : inputs ? s->second.first : s->second.second) out.push_back(other);
      }
      ids = out;
    };
    for (Json& st : prog["streams"]) {
      Json kept = Json::array();
      for (Json& in : st["instructions"]) {
        if (in.value("role", "") == "tp_grad_sum") {
          ++dropped;
          continue;
        }
        if (in.contains("inputs")) rewire(in["inputs"], true);
        if (in.contains("outputs")) rewire(in["outputs"], false);
        kept.push_back(in);
      }
      st["instructions"] = kept;
    }
  }
  ASSERT_GT(dropped, 0u);
  const std::string error = error_of(j);
  EXPECT_NE(error.find("without summing over tp its gradients that are partial on each tensor rank"), std::string::npos)
      << error;
  EXPECT_NE(error.find("emit the plan again"), std::string::npos) << error;
}

TEST(PlanIoTest, ExpertReductionAgainstTheRuleIsRefused) {
  const Json good = compiled("dp=2,tp=2,sp=1,zero=1,microbatches=2").to_json();
  ASSERT_TRUE(plan_from_json(good, "f.json").ok());
  Json j = good;
  size_t moved = 0;
  for (Json& prog : j["programs"]) {
    for (Json& st : prog["streams"]) {
      for (Json& in : st["instructions"]) {
        // The reductions only (ZeRO-1's all-gather of the parameters is checked by the next case).
        if (in.value("op", "") == "collective" && in.value("part", "") == "experts" && in.value("group", "") == "edp" &&
            in.value("comm", "") != "all_gather") {
          in["group"] = "dp";
          ++moved;
        }
      }
    }
  }
  ASSERT_GT(moved, 0u);
  const std::string error = error_of(j);
  EXPECT_NE(error.find("reduces the experts' gradients over dp, but under sequence parallelism with tp=2"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("emit the plan again"), std::string::npos) << error;
  // The parameters' all-gather moved alone.
  Json g = good;
  for (Json& prog : g["programs"]) {
    for (Json& st : prog["streams"]) {
      for (Json& in : st["instructions"]) {
        if (in.value("part", "") == "experts" && in.value("group", "") == "edp" &&
            in.value("comm", "") == "all_gather") {
          in["group"] = "dp";
        }
      }
    }
  }
  const std::string gather_error = error_of(g);
  EXPECT_NE(gather_error.find("gathers the experts' parameters over dp"), std::string::npos) << gather_error;
}

// tp_overlap's all-gather runs as ring steps, point to point on its ring's tag, which the compiler assigns (the
// same on every tp rank of a template, one per ring) and a plan file must carry.
TEST(PlanIoTest, RingStepsCarryTheirRingsTag) {
  const Plan plan = compiled(kStrategies[3]);
  std::set<int64_t> tags;
  int steps = 0;
  for (const Program& p : plan.templates) {
    for (const Stream& s : p.streams) {
      for (const Instruction& in : s.instrs) {
        if (in.algorithm != "ring_step") continue;
        ++steps;
        EXPECT_GE(in.tag, 0) << in.label;
        EXPECT_LE(in.tag, 32767) << in.label;
        tags.insert(in.tag);
      }
    }
  }
  ASSERT_GT(steps, 0);
  EXPECT_GT(tags.size(), 1u);  // rings of different chunks are told apart
  Json j = plan.to_json();
  Json* step = nullptr;
  for (Json& s : j["programs"][0]["streams"]) {
    for (Json& in : s["instructions"]) {
      if (step == nullptr && in.contains("algorithm") && in["algorithm"] == "ring_step") step = &in;
    }
  }
  ASSERT_NE(step, nullptr);
  step->erase("tag");
  EXPECT_NE(error_of(j).find("a ring_step piece needs \"tag\" in [0, 32767]"), std::string::npos) << error_of(j);
}

// Any key of any of the first instructions removed or set to another type: loaded or refused, never a crash.
TEST(PlanIoTest, EveryFieldRemovedOrRetypedIsHandled) {
  const Json good = compiled(kStrategies[0]).to_json();
  int refused = 0;
  for (size_t s = 0; s < good["programs"][0]["streams"].size(); ++s) {
    const Json& in = good["programs"][0]["streams"][s]["instructions"][0];
    for (const auto& [key, value] : in.items()) {
      for (const Json& other : {Json(), Json("x"), Json(-5), Json::array(), Json(1.5)}) {
        Json j = good;
        Json& target = j["programs"][0]["streams"][s]["instructions"][0];
        if (other.is_null()) {
          target.erase(key);
        } else {
          target[key] = other;
        }
        refused += plan_from_json(j).ok() ? 0 : 1;
      }
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(PlanIoTest, FilesAreWrittenAtomicallyAndReadBack) {
  const Plan plan = compiled(kStrategies[1]);
  const std::string path = std::string(PIPER_BINARY_DIR) + "/plan_io_test_plan.json";
  ASSERT_TRUE(write_plan_file(path, plan).ok());
  auto back = load_plan_file(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(*back == plan);
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("{\"format\": \"piper-plan\", \"version\": 2, \"mesh\": {", f);
  std::fclose(f);
  auto truncated = load_plan_file(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find(path), std::string::npos);
  auto missing = load_plan_file(path + ".absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(".absent"), std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace piper::compile
