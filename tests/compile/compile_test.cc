// Compiling full MoE models: strategies, directive files, ZeRO-3 under PP x EP, errors and deadlocks.
#include "piper/compile/compile.h"

#include "piper/base/check.h"

#include <gtest/gtest.h>

#include "piper/compile/strategy_directives.h"
#include "piper/ir/passes/passes.h"
#include "piper/spec/model_loader.h"

namespace piper::compile {
namespace {

ModelSpec tiny() {
  auto m = load_model("tiny-moe");
  PIPER_CHECK_OK(m.status());
  return *m;
}

TrainSpec train_for(const Strategy& s) {
  TrainSpec t;
  t.micro_batch_size = 1;
  t.seq_len = 64;
  t.global_batch = s.global_batch();
  return t;
}

Strategy strategy(const std::string& text) {
  auto s = Strategy::parse(text);
  PIPER_CHECK_OK(s.status());
  return *s;
}

Result<CompileResult> compile(const std::string& text, CompileOptions o = {}) {
  o.verify_each_pass = true;
  Strategy s = strategy(text);
  return compile_strategy(tiny(), train_for(s), s, o);
}

size_t count(const Program& p, OpKind op, const std::string& label_part) {
  size_t n = 0;
  for (const auto& st : p.streams) {
    for (const auto& in : st.instrs) n += in.op == op && in.label.find(label_part) != std::string::npos;
  }
  return n;
}

TEST(CompileTest, PipelineExpertZero3CompilesAndReshardsPerMicrobatch) {
  auto r = compile("dp=4,pp=2,ep=4,zero=3,schedule=1f1b,microbatches=4");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Plan& plan = r->plan;
  EXPECT_EQ(plan.world_size, 8);
  ASSERT_EQ(plan.templates.size(), 2u);
  EXPECT_EQ(plan.rank_template[5], 1);  // ranks 4..7 run pipeline rank 1's program
  const Program& p0 = plan.templates[0];
  // Layer 0 attention: parameters gathered before, and re-sharded after, every F and every BW of every mb.
  for (int mb = 0; mb < 4; ++mb) {
    std::string f = "L0.attn.ag.F.mb" + std::to_string(mb);
    EXPECT_EQ(count(p0, OpKind::kCollective, f), 1u) << f;
    EXPECT_EQ(count(p0, OpKind::kFree, "after L0.attn.F.mb" + std::to_string(mb) + " (re-shard)"), 1u);
    EXPECT_EQ(count(p0, OpKind::kFree, "after L0.attn.BW.mb" + std::to_string(mb) + " (re-shard)"), 1u);
    // Gradients reduce-scattered per microbatch (accumulated sharded).
    EXPECT_EQ(count(p0, OpKind::kCollective, "L0.attn.rs.mb" + std::to_string(mb)), 1u);
  }
  // Experts are sharded over ep=4 and replicated over edp = dp/ep = 1: no ZeRO collectives for them.
  EXPECT_EQ(count(plan.templates[1], OpKind::kCollective, "L3.experts.ag"), 0u);
  EXPECT_GT(count(plan.templates[1], OpKind::kCollective, "L3.dispatch"), 0u);
  // ZeRO-3 holds less model state than ZeRO-1.
  auto z1 = compile("dp=4,pp=2,ep=4,zero=1,schedule=1f1b,microbatches=4");
  ASSERT_TRUE(z1.ok()) << z1.status().message();
  EXPECT_LT(p0.static_bytes, z1->plan.templates[0].static_bytes);
}

TEST(CompileTest, EveryScheduleCompilesAndVerifies) {
  for (const char* s : {"dp=2,pp=2,schedule=gpipe,microbatches=4", "dp=2,pp=2,ep=2,schedule=1f1b,microbatches=4",
                        "pp=2,vpp=2,schedule=interleaved,microbatches=4", "dp=2,pp=2,zero=2,schedule=zb-h1,microbatches=4",
                        "dp=2,ep=2,pp=2,schedule=dualpipev,microbatches=4,recompute=full",
                        "tp=2,sp=1,pp=2,schedule=1f1b,microbatches=2",
                        "dp=2,ep=2,pp=2,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=2"}) {
    auto r = compile(s);
    ASSERT_TRUE(r.ok()) << s << ": " << r.status().message();
    EXPECT_GT(r->stats.instructions, 0u);
  }
}

TEST(CompileTest, DisaggregationUsesM2N) {
  auto r = compile("dp=2,ep=2,pp=2,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  size_t m2n = 0, a2a = 0;
  for (const auto& p : r->plan.templates) {
    for (const auto& st : p.streams) {
      for (const auto& in : st.instrs) {
        m2n += in.comm == ir::NodeKind::kM2N;
        a2a += in.comm == ir::NodeKind::kAllToAll;
      }
    }
  }
  EXPECT_GT(m2n, 0u);
  EXPECT_EQ(a2a, 0u);  // dispatch and combine became m2n exchanges
}

TEST(CompileTest, DirectiveFileAndBuiltinScheduleGiveIdenticalPlans) {
  for (const char* text : {"dp=4,pp=2,ep=2,zero=3,schedule=1f1b,microbatches=4",
                           "dp=2,pp=2,schedule=dualpipev,microbatches=4"}) {
    Strategy s = strategy(text);
    auto builtin = compile_strategy(tiny(), train_for(s), s);
    ASSERT_TRUE(builtin.ok()) << builtin.status().message();
    auto directives = strategy_directives(s, tiny());
    ASSERT_TRUE(directives.ok());
    std::string path = std::string(PIPER_BINARY_DIR) + "/compile_test_directives.json";
    ASSERT_TRUE(write_text_file(path, ir::directives_to_json(*directives).dump(1)).ok());
    auto loaded = ir::load_directives_file(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    auto mesh = strategy_mesh(s, tiny());
    ASSERT_TRUE(mesh.ok());
    auto from_file = compile_directives(tiny(), train_for(s), *mesh, *loaded);
    ASSERT_TRUE(from_file.ok()) << from_file.status().message();
    EXPECT_EQ(builtin->plan.to_json(), from_file->plan.to_json()) << text;
  }
}

std::vector<ir::Directive> parse(const std::string& text) {
  auto d = ir::directives_from_json(Json::parse(text), "user.json");
  PIPER_CHECK_OK(d.status());
  return *d;
}

ir::MeshInfo mesh_pp2() {
  ir::MeshInfo m;
  m.pp = 2;
  return m;
}

TEST(CompileTest, ImpossibleDirectivesNameTheDirective) {
  TrainSpec t = train_for(strategy("pp=2"));
  auto r = compile_directives(tiny(), t, mesh_pp2(), parse(R"([
    {"directive": "split", "microbatches": 2},
    {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0},
    {"directive": "place", "filter": {"layer": "2-3"}, "stage": 4}])"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("directive 2 (place): stage 4 does not exist"), std::string::npos)
      << r.status().message();
  r = compile_directives(tiny(), t, mesh_pp2(), parse(R"([
    {"directive": "split", "microbatches": 2},
    {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0, "rank": 0},
    {"directive": "place", "filter": {"layer": "2-3"}, "stage": 1, "rank": 1},
    {"directive": "order", "rank": 0, "slots": ["0BW0", "0F0", "0F1", "0BW1"]}])"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("directive 3 (order)"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("cycle"), std::string::npos) << r.status().message();
}

// An order that is a valid DAG but deadlocks with blocking sends: rank 1 wants microbatch 1 first while rank 0
// sends microbatch 0 first on the same stream.
TEST(CompileTest, VerifierFindsBlockingDeadlock) {
  TrainSpec t = train_for(strategy("pp=2"));
  auto r = compile_directives(tiny(), t, mesh_pp2(), parse(R"([
    {"directive": "split", "microbatches": 2},
    {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0, "rank": 0},
    {"directive": "place", "filter": {"layer": "2-3"}, "stage": 1, "rank": 1},
    {"directive": "order", "rank": 0, "slots": ["0F0", "0F1", "0BW0", "0BW1"]},
    {"directive": "order", "rank": 1, "slots": ["1F1", "1BW1", "1F0", "1BW0"]}])"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compile: verify: deadlock"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("rank 0 stream 'p2p_fwd'"), std::string::npos)
      << r.status().message();
}

TEST(CompileTest, MemoryCapacityIsChecked) {
  CompileOptions o;
  o.capacity_bytes = 1 << 20;  // 1 MiB: too small for tiny-moe's pipeline stage
  auto r = compile("dp=2,pp=2,schedule=1f1b,microbatches=4", o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("rank 0 needs"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace piper::compile
