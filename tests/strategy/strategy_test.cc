#include "piper/strategy/strategy.h"

#include <gtest/gtest.h>

#include "piper/spec/model_spec.h"
#include "piper/spec/train_spec.h"

namespace piper {
namespace {

// DeepSeek-V3's shape as far as validate_for looks at it (config_671B.json).
ModelSpec deepseek_like() {
  ModelSpec m;
  m.name = "deepseek-v3";
  m.num_layers = 61;
  m.hidden_size = 7168;
  m.num_heads = 128;
  m.num_kv_heads = 128;
  m.attention = AttentionType::kMLA;
  m.moe.num_experts = 256;
  m.moe.top_k = 8;
  return m;
}

ModelSpec mixtral_like() {
  ModelSpec m;
  m.name = "mixtral-8x7b";
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  return m;
}

TrainSpec batch(int64_t global_batch, int64_t mbs = 1) {
  TrainSpec t;
  t.global_batch = global_batch;
  t.micro_batch_size = mbs;
  return t;
}

// Asserts that `status` failed and its message contains `needle`.
void expect_error(const Status& status, const std::string& needle) {
  ASSERT_FALSE(status.ok()) << "expected an error containing: " << needle;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status.message();
}

TEST(StrategyTest, DefaultsAndDocumentedExample) {
  auto s = Strategy::parse("dp=8,tp=1,pp=4,vpp=1,ep=8,zero=1,sp=0,recompute=none,schedule=1f1b,microbatches=16,mbs=1");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->dp, 8);
  EXPECT_EQ(s->pp, 4);
  EXPECT_EQ(s->ep, 8);
  EXPECT_EQ(s->edp(), 1);
  EXPECT_EQ(s->global_batch(), 128);
  EXPECT_EQ(s->world_size(), 32);
  EXPECT_TRUE(s->validate().ok());
  auto empty = Strategy::parse("");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, Strategy{});
}

TEST(StrategyTest, CompactRoundTrip) {
  const char* cases[] = {
      "dp=128,pp=16,ep=64,zero=1,schedule=dualpipev,microbatches=32",
      "dp=4,tp=2,pp=2,vpp=3,sp=1,recompute=selective,schedule=interleaved,microbatches=8,mbs=2,order=tp-dp-ep-pp",
      "dp=2,tp=4,etp=2,ep=2,zero=3,sp=1,recompute=full,schedule=gpipe,a2a=halo",
      "dp=2,pp=2,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4,microbatches=4",
      "schedule=zb-h1,pp=4,microbatches=4",
  };
  for (const char* text : cases) {
    auto s = Strategy::parse(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status().to_string();
    auto again = Strategy::parse(s->to_string());
    ASSERT_TRUE(again.ok()) << s->to_string();
    EXPECT_EQ(*again, *s) << s->to_string();
    auto from_json = Strategy::from_json(s->to_json());
    ASSERT_TRUE(from_json.ok()) << from_json.status().to_string();
    EXPECT_EQ(*from_json, *s);
    auto from_text = Strategy::parse(s->to_json().dump());
    ASSERT_TRUE(from_text.ok());
    EXPECT_EQ(*from_text, *s);
  }
}

TEST(StrategyTest, JsonAcceptsOrderArrayAndBooleans) {
  auto s = Strategy::parse(R"({"dp": 4, "sp": true, "tp": 2, "order": ["ep", "tp", "dp", "pp"]})");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->sp);
  EXPECT_EQ(s->order, (std::vector<std::string>{"ep", "tp", "dp", "pp"}));
  expect_error(Strategy::parse(R"({"dp": [1]})").status(), "strategy.dp");
  expect_error(Strategy::parse(R"({"dpp": 2})").status(), "did you mean 'dp'");
  expect_error(Strategy::parse("[1,2]").status(), "strategy");
}

// Parse errors: unknown keys get a "did you mean", bad values the allowed set.
TEST(StrategyTest, ParseErrors) {
  struct Row {
    const char* text;
    const char* needle;
  };
  const Row rows[] = {
      {"dp=8,microbatch=4", "did you mean 'microbatches'"},
      {"dp=8,shedule=1f1b", "did you mean 'schedule'"},
      {"schedule=dualpipe", "{1f1b, gpipe, interleaved, zb-h1, dualpipev, af-pipe}"},
      {"schedule=dualpipe", "did you mean 'dualpipev'"},
      {"recompute=some", "{none, selective, full}"},
      {"a2a=tree", "{flat, halo}"},
      {"sp=2", "must be 0 or 1"},
      {"dp=eight", "dp"},
      {"dp=8,,pp=2", "empty item"},
      {"dp8", "expected key=value"},
      {"dp=2,dp=4", "given twice"},
      {"dp=", "has no value"},
      {"dp=-1", "out of range"},
  };
  for (const auto& row : rows) expect_error(Strategy::parse(row.text).status(), row.needle);
}

// validate(): rules that need no model.
TEST(StrategyTest, ValidateRules) {
  struct Row {
    const char* text;
    const char* needle;
  };
  const Row rows[] = {
      {"dp=0", "dp=0 must be >= 1"},
      {"zero=4", "zero=4 must be one of {0,1,2,3}"},
      {"dp=8,ep=3", "pick ep in {1,2,4,8}"},
      {"tp=4,etp=3,sp=1", "etp=3 does not divide tp=4"},
      {"sp=1", "sp=1 needs tp >= 2"},
      {"pp=4,microbatches=2", "1f1b needs microbatches >= pp=4"},
      {"pp=4,microbatches=7,schedule=dualpipev", "dualpipev needs microbatches >= 2*pp = 8"},
      {"pp=4,microbatches=8,schedule=interleaved", "interleaved needs vpp >= 2"},
      {"pp=4,vpp=2,microbatches=6,schedule=interleaved", "divisible by pp=4"},
      {"pp=2,vpp=2,microbatches=4", "vpp=2 needs schedule=interleaved"},
      {"order=tp-ep-dp", "must list each of tp, ep, dp, pp once"},
      {"order=tp-tp-dp-pp", "axis 'tp' appears 2 times"},
      {"schedule=af-pipe", "af-pipe needs disagg=1"},
      {"disagg=1", "disagg=1 needs schedule=af-pipe"},
      {"dp=2,schedule=af-pipe,disagg=1,attn_ranks=3,ffn_ranks=2", "attn_ranks=3 != dp*tp*pp = 2"},
      // Found by fuzz/strategy_string_fuzz (fuzz/corpus/strategy_string/crash-ffn-ranks-without-disagg).
      {"ffn_ranks=4", "take effect only with disagg=1,schedule=af-pipe"},
      // Products of degrees that overflow an int (fuzz/corpus/strategy_string/crash-world-size-overflow): the
      // bounds on the world and on vpp refuse them before any product is formed.
      {"dp=65536,tp=65536", "dp*tp*pp = 4294967296 ranks is out of range; allowed <= 1048576"},
      {"pp=65536,vpp=65536,microbatches=65536,schedule=interleaved", "vpp=65536 is out of range; allowed 1..1024"},
      // MoE parallel folding: ep over tp*dp; the unfolded error points to it when it would fit.
      {"dp=16,tp=2,sp=1,ep=32", "or set fold=1"},
      {"dp=16,tp=2,sp=1,ep=3,fold=1", "ep=3 does not divide tp*dp=32"},
      {"dp=4,tp=2,sp=1,ep=8,etp=2,fold=1", "fold=1 with etp=2 is not built"},
      {"dp=8,tp=2,sp=1,ep=4,fold=1,order=dp-tp-ep-pp", "drop order="},
      {"dp=4,tp=2,sp=1,ep=8,fold=1,order=dp-tp-ep-pp", "drop order="},
      {"dp=2,ep=2,fold=1,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2", "with disagg=1"},
      // af-pipe's FFN ranks keep whole experts: an etp there would be priced but never run.
      {"dp=2,tp=2,sp=1,etp=2,ep=2,schedule=af-pipe,disagg=1,attn_ranks=4,ffn_ranks=4", "set etp=1"},
      // The NIC split belongs to af-pipe and takes both sides.
      {"dp=2,attn_ports=1,ffn_ports=1", "add disagg=1,schedule=af-pipe"},
      {"dp=2,ep=2,schedule=af-pipe,disagg=1,attn_ranks=2,ffn_ranks=2,ffn_ports=3", "set both"},
      // tp_overlap pipelines the sequence-parallel collectives: tp > 1 and sp=1, as Megatron asserts.
      {"tp=2,sp=0,tp_overlap=1", "needs tp >= 2 and sp=1"},
      {"tp_overlap=1", "set sp=1 or drop tp_overlap"},
  };
  for (const auto& row : rows) {
    auto s = Strategy::parse(row.text);
    ASSERT_TRUE(s.ok()) << row.text << ": " << s.status().to_string();
    expect_error(s->validate(), row.needle);
  }
}

TEST(StrategyTest, FoldRoundTripsAndCountsExpertReplicas) {
  auto s = Strategy::parse("dp=16,tp=2,sp=1,pp=8,vpp=4,ep=32,fold=1,microbatches=128,schedule=interleaved");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->fold);
  EXPECT_TRUE(s->validate().ok()) << s->validate().message();
  EXPECT_EQ(s->expert_replicas(), 1);
  EXPECT_NE(s->to_string().find(",fold=1"), std::string::npos);
  EXPECT_EQ(*Strategy::parse(s->to_string()), *s);
  EXPECT_EQ(*Strategy::from_json(s->to_json()), *s);
  // Unfolded strings keep their form; the replica count is the same folded or not.
  auto u = Strategy::parse("dp=8,tp=2,sp=1,ep=4");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->to_string().find("fold"), std::string::npos);
  EXPECT_EQ(u->expert_replicas(), 4);
  u->fold = true;
  EXPECT_EQ(u->expert_replicas(), 4);
}

TEST(StrategyTest, TpOverlapRoundTripsAndPrintsOnlyWhenSet) {
  auto s = Strategy::parse("dp=2,tp=4,sp=1,tp_overlap=1");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->tp_overlap);
  EXPECT_TRUE(s->validate().ok()) << s->validate().message();
  EXPECT_NE(s->to_string().find(",tp_overlap=1"), std::string::npos);
  EXPECT_EQ(*Strategy::parse(s->to_string()), *s);
  EXPECT_EQ(*Strategy::from_json(s->to_json()), *s);
  EXPECT_EQ(Strategy::parse("dp=2,tp=4,sp=1")->to_string().find("tp_overlap"), std::string::npos);
  expect_error(Strategy::parse("tp=2,sp=1,tp_overlap=2").status(), "tp_overlap");
}

TEST(StrategyTest, EpOverlapRoundTripsAndNeedsEpAndAPairingSchedule) {
  auto s = Strategy::parse("dp=8,ep=8,pp=2,vpp=2,schedule=interleaved,microbatches=4,ep_overlap=1");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE(s->ep_overlap);
  EXPECT_TRUE(s->validate().ok()) << s->validate().message();
  EXPECT_NE(s->to_string().find(",ep_overlap=1"), std::string::npos);
  EXPECT_EQ(*Strategy::parse(s->to_string()), *s);
  EXPECT_EQ(*Strategy::from_json(s->to_json()), *s);
  EXPECT_EQ(Strategy::parse("dp=8,ep=8")->to_string().find("ep_overlap"), std::string::npos);
  EXPECT_TRUE(Strategy::parse("dp=2,ep=2,ep_overlap=1,microbatches=2")->validate().ok());
  expect_error(Strategy::parse("dp=2,ep_overlap=1")->validate(), "needs ep >= 2");
  expect_error(Strategy::parse("dp=4,ep=2,pp=2,schedule=dualpipev,microbatches=4,ep_overlap=1")->validate(),
               "schedule=dualpipev pairs them by itself");
  expect_error(Strategy::parse("dp=4,ep=2,pp=2,schedule=gpipe,microbatches=4,ep_overlap=1")->validate(),
               "schedule=gpipe has no such pairs");
  expect_error(Strategy::parse("dp=4,ep=2,pp=2,schedule=1f1b,microbatches=4,ep_overlap=1")->validate(),
               "needs schedule=interleaved");
}

TEST(StrategyTest, RecomputeModulesRoundTripSortedAndNameMegatronsAlternatives) {
  auto s = Strategy::parse("dp=8,ep=8,recompute_modules=moe_act+layernorm+moe_act");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->recompute_modules, (std::vector<std::string>{"layernorm", "moe_act"}));
  EXPECT_TRUE(s->recomputes_module("layernorm"));
  EXPECT_TRUE(s->recomputes_module("moe_act"));
  EXPECT_TRUE(s->validate().ok()) << s->validate().message();
  EXPECT_NE(s->to_string().find(",recompute_modules=layernorm+moe_act"), std::string::npos);
  EXPECT_EQ(*Strategy::parse(s->to_string()), *s);
  EXPECT_EQ(*Strategy::from_json(s->to_json()), *s);
  EXPECT_EQ(Strategy::parse("dp=8,ep=8")->to_string().find("recompute_modules"), std::string::npos);
  EXPECT_FALSE(Strategy::parse("dp=8,ep=8")->to_json().contains("recompute_modules"));
  EXPECT_EQ(*Strategy::parse(R"({"dp": 8, "ep": 8, "recompute_modules": ["moe_act", "layernorm"]})"), *s);
  expect_error(Strategy::parse(R"({"recompute_modules": [1]})").status(), "expected an array of names");
  expect_error(Strategy::parse("recompute_modules=core_attn").status(), "recompute=selective");
  expect_error(Strategy::parse("recompute_modules=moe").status(), "recompute=full");
  expect_error(Strategy::parse("recompute_modules=layernorn").status(), "did you mean 'layernorm'");
  expect_error(Strategy::parse("dp=8,ep=8,recompute=full,recompute_modules=moe_act")->validate(),
               "full recomputation already drops");
  Strategy unsorted;
  unsorted.recompute_modules = {"moe_act", "layernorm"};
  expect_error(unsorted.validate(), "sorted set");
}

// validate_for(): rules against a model, a batch and a world size.
TEST(StrategyTest, ValidateForRules) {
  struct Row {
    const char* text;
    ModelSpec model;
    int64_t global_batch;
    int world;
    const char* needle;  // nullptr = must pass
  };
  const Row rows[] = {
      {"dp=128,pp=16,ep=64,zero=1,schedule=dualpipev,microbatches=32", deepseek_like(), 4096, 2048, nullptr},
      {"dp=64,pp=16,ep=64,schedule=dualpipev,microbatches=32", deepseek_like(), 2048, 2048,
       "world 2048 != dp*tp*pp = 1024; set dp=128"},
      {"dp=8,ep=8,microbatches=16", mixtral_like(), 128, 8, nullptr},
      {"dp=6,ep=6,microbatches=16", mixtral_like(), 96, 6, "ep=6 does not divide num_experts=8; pick ep in {1,2}"},
      {"dp=8,ep=8,microbatches=12", mixtral_like(), 128, 8,
       "microbatches*mbs*dp = 96 != global batch 128; set microbatches=16"},
      {"dp=8,microbatches=12,mbs=2", mixtral_like(), 100, 8, "mbs=2 != train micro_batch_size=1"},
      {"pp=32,vpp=2,schedule=interleaved,microbatches=64", deepseek_like(), 64, 32, "pp*vpp=64 > num_layers=61"},
      {"pp=32,schedule=dualpipev,microbatches=64", deepseek_like(), 64, 32, "pp*2 (dualpipev)=64 > num_layers=61"},
      {"tp=3,sp=1", mixtral_like(), 1, 3, "tp=3 does not divide num_heads=32"},
      {"tp=2,dp=2,ep=2", mixtral_like(), 2, 4, "needs sp=1"},
      {"tp=16,sp=1", mixtral_like(), 1, 16, "does not divide num_kv_heads=8"},
  };
  for (const auto& row : rows) {
    auto s = Strategy::parse(row.text);
    ASSERT_TRUE(s.ok()) << row.text << ": " << s.status().to_string();
    Status st = s->validate_for(row.model, batch(row.global_batch), row.world);
    if (row.needle == nullptr) {
      EXPECT_TRUE(st.ok()) << row.text << ": " << st.to_string();
    } else {
      expect_error(st, row.needle);
    }
  }
  ModelSpec dense = mixtral_like();
  dense.moe = MoeSpec{};
  auto s = Strategy::parse("dp=8,ep=8,microbatches=16");
  expect_error(s->validate_for(dense, batch(128), 8), "has no routed experts; set ep=1");
  auto modules = Strategy::parse("dp=8,microbatches=16,recompute_modules=layernorm");
  expect_error(modules->validate_for(dense, batch(128), 8), "acts on MoE layers only");
  EXPECT_TRUE(modules->validate_for(mixtral_like(), batch(128), 8).ok());
  // Sequence parallelism needs equal token slices: mbs*seq a multiple of tp (refused before any rank starts).
  TrainSpec odd = batch(2);
  odd.seq_len = 4095;
  auto sp = Strategy::parse("tp=2,sp=1,microbatches=2");
  expect_error(sp->validate_for(mixtral_like(), odd, 2),
               "splits each microbatch's mbs*seq = 4095 tokens over tp=2 ranks, and 2 does not divide it; make mbs*seq "
               "a multiple of tp (e.g. seq 4096)");
  odd.seq_len = 4096;
  EXPECT_TRUE(sp->validate_for(mixtral_like(), odd, 2).ok());
}

TEST(StrategyTest, ChunksPerRank) {
  EXPECT_EQ(Strategy::parse("pp=4,microbatches=8,schedule=dualpipev")->num_stages(), 8);
  EXPECT_EQ(Strategy::parse("pp=4,vpp=3,microbatches=8,schedule=interleaved")->num_stages(), 12);
  EXPECT_EQ(Strategy::parse("pp=4,microbatches=8")->num_stages(), 4);
  EXPECT_EQ(Strategy::parse("schedule=zb-h1")->schedule_kind(), ScheduleKind::kZBH1);
  EXPECT_FALSE(parse_schedule("zb_h1").ok());
}

}  // namespace
}  // namespace piper

namespace piper {
namespace {

std::string strategy_error(const std::string& text) {
  auto s = Strategy::parse(text);
  if (!s.ok()) return s.status().message();
  Status v = s->validate();
  return v.ok() ? "" : v.message();
}

// microbatches=16777216 passed the parser and threw std::bad_alloc in simulate/compile.
TEST(StrategyBoundsTest, MicrobatchesHaveAnUpperBound) {
  const std::string e = strategy_error("microbatches=16777216");
  EXPECT_NE(e.find("microbatches=16777216 is out of range; allowed 1..65536"), std::string::npos) << e;
  EXPECT_EQ(strategy_error("microbatches=65536"), "");
}

TEST(StrategyBoundsTest, PipelineActionsHaveAnUpperBound) {
  const std::string e = strategy_error("pp=64,microbatches=65536");
  EXPECT_NE(e.find("microbatches*pp*chunks = 65536*64*1 = 4194304 pipeline actions is out of range"), std::string::npos)
      << e;
  EXPECT_NE(e.find("GiB"), std::string::npos) << e;
  // GPT-1T's published run (pp=64, 512 microbatches) and DeepSeek-V3's (pp=16 dualpipev) stay inside.
  EXPECT_EQ(strategy_error("dp=6,tp=8,pp=64,microbatches=512"), "");
  EXPECT_EQ(strategy_error("dp=128,pp=16,ep=64,zero=1,schedule=dualpipev,microbatches=120"), "");
}

TEST(StrategyBoundsTest, DegreesAndTheirProductHaveUpperBounds) {
  std::string e = strategy_error("dp=16777216");
  EXPECT_NE(e.find("dp=16777216 is out of range; allowed 1..1048576"), std::string::npos) << e;
  e = strategy_error("dp=4096,tp=4096");  // 2^24 ranks; dp*tp*pp overflowed int at 2^31 before
  EXPECT_NE(e.find("dp*tp*pp = 16777216 ranks is out of range; allowed <= 1048576"), std::string::npos) << e;
  e = strategy_error("schedule=interleaved,vpp=5000,pp=1");
  EXPECT_NE(e.find("vpp=5000 is out of range; allowed 1..1024"), std::string::npos) << e;
  e = strategy_error("mbs=100000");
  EXPECT_NE(e.find("mbs=100000 is out of range; allowed 1..65536"), std::string::npos) << e;
  e = strategy_error("schedule=af-pipe,disagg=1,attn_ranks=4000000,ffn_ranks=4");
  EXPECT_NE(e.find("attn_ranks=4000000 is out of range"), std::string::npos) << e;
  EXPECT_EQ(strategy_error("dp=1024,pp=8,microbatches=8"), "");  // 8,192 GPUs
}

}  // namespace
}  // namespace piper
