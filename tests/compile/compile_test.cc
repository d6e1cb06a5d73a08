// Compiling full MoE models: strategies, directive files, ZeRO-3 under PP x EP, errors and deadlocks.
#include "piper/compile/compile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "piper/base/check.h"
#include "piper/compile/strategy_directives.h"
#include "piper/compile/target.h"
#include "piper/compile/verify_plan.h"
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

// ZeRO-3 prefetches per FSDP unit (a layer's chunks of one microbatch and pass, as Megatron-FSDP and PyTorch FSDP
// wrap transformer layers): every gather of layer L's forward may start once layer L-2's forward is done, so it
// overlaps all of layer L-1 (attention, router and experts), not just the chunk before it.
TEST(CompileTest, Zero3PrefetchesOneLayerAhead) {
  auto r = compile("dp=4,ep=2,zero=3,microbatches=2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ir::Graph& g = r->graph;
  int checked = 0, experts = 0;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kAllGather || n.group == "tp" || n.tags.mb < 0 || n.tags.pass != ir::Pass::kF ||
        n.tags.layer < 2 || n.tags.layer >= g.num_layers)
      continue;
    std::vector<int> window_layers;
    for (int e : g.in_edges(n.id)) {
      const ir::Edge& edge = g.edge(e);
      if (!edge.alive || edge.kind != ir::EdgeKind::kTemporal) continue;
      const ir::Node& w = g.node(edge.src);
      EXPECT_EQ(w.tags.mb, n.tags.mb) << n.name << " waits for " << w.name;
      window_layers.push_back(w.tags.layer);
    }
    ASSERT_EQ(window_layers.size(), 1u) << n.name;
    EXPECT_EQ(window_layers[0], n.tags.layer - 2) << n.name;
    ++checked;
    experts += n.tags.part == "experts";
  }
  EXPECT_GT(checked, 0);
  EXPECT_GT(experts, 0);
}

TEST(CompileTest, EveryScheduleCompilesAndVerifies) {
  for (const char* s :
       {"dp=2,pp=2,schedule=gpipe,microbatches=4", "dp=2,pp=2,ep=2,schedule=1f1b,microbatches=4",
        "pp=2,vpp=2,schedule=interleaved,microbatches=4", "dp=2,pp=2,zero=2,schedule=zb-h1,microbatches=4",
        "dp=2,ep=2,pp=2,schedule=dualpipev,microbatches=4,recompute=full",
        "tp=2,sp=1,pp=2,schedule=1f1b,microbatches=2",
        "dp=2,ep=2,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=2"}) {
    auto r = compile(s);
    ASSERT_TRUE(r.ok()) << s << ": " << r.status().message();
    EXPECT_GT(r->stats.instructions, 0u);
    Strategy parsed = strategy(s);
    EXPECT_TRUE(parsed.validate_for(tiny(), train_for(parsed), parsed.world_size()).ok()) << s;
    EXPECT_EQ(r->plan.world_size, parsed.world_size()) << s;
  }
}

// Split-backward schedules with tensor parallelism: the TP collective on the backward path carries input
// gradients, so it must follow B, not W (following W made W feed the previous chunk's B: an order cycle). The
// gradient sums over tp (is_tp_grad_sum) carry weight gradients and follow W.
TEST(CompileTest, SplitBackwardSchedulesComposeWithTensorParallelism) {
  for (const char* s : {"tp=2,sp=1,pp=2,schedule=zb-h1,microbatches=4", "tp=2,sp=0,pp=2,schedule=zb-h1,microbatches=4",
                        "tp=2,sp=1,pp=2,schedule=dualpipev,microbatches=4",
                        "dp=2,tp=2,sp=1,pp=2,zero=1,schedule=zb-h1,microbatches=4"}) {
    auto r = compile(s);
    ASSERT_TRUE(r.ok()) << s << ": " << r.status().message();
    int tp_collectives = 0;
    for (const ir::Node& n : r->graph.nodes()) {
      if (n.group != "tp" || n.kind == ir::NodeKind::kChunk || ir::is_tp_grad_sum(n)) continue;
      for (ir::NodeId p : r->graph.preds(n.id)) {
        const ir::Node& src = r->graph.node(p);
        if (src.kind != ir::NodeKind::kChunk) continue;
        ++tp_collectives;
        EXPECT_NE(src.tags.pass, ir::Pass::kW) << s << ": " << n.name << " follows a weight-gradient task " << src.name;
      }
    }
    EXPECT_GT(tp_collectives, 0) << s;
  }
}

// Megatron sequence parallelism: per layer and microbatch, attention and MLP each get an all-gather on their
// input and a reduce-scatter on their output, forward and backward alike (8 TP collectives), also where two
// TP chunks are neighbours. Without sequence parallelism: one all-reduce per chunk and direction (4).
TEST(CompileTest, TensorParallelCollectivesPerLayerAreMegatrons) {
  for (bool sp : {true, false}) {
    std::string s = std::string("tp=2,sp=") + (sp ? "1" : "0") + ",pp=1,schedule=1f1b,microbatches=2";
    auto r = compile(s);
    ASSERT_TRUE(r.ok()) << s << ": " << r.status().message();
    int count = 0;
    for (const ir::Node& n : r->graph.nodes()) {
      if (n.group != "tp" || n.kind == ir::NodeKind::kChunk || n.tags.layer != 0 || n.tags.mb != 0) continue;
      if (n.tags.part.rfind("attn.", 0) != 0 && n.tags.part.rfind("mlp.", 0) != 0) continue;
      ++count;
    }
    EXPECT_EQ(count, sp ? 8 : 4) << s;
  }
}

ModelSpec tiny16() {
  ModelSpec m = tiny();
  m.num_layers = 16;  // enough stages for pp=8 DualPipeV (16 stages) and AF-Pipe (4 layers per group)
  return m;
}

// The full pipeline (passes -> lowering -> plan verifier with blocking send/recv), not only the action lists.
TEST(CompileTest, DualPipeVAndAfPipePlansAreDeadlockFree) {
  const ModelSpec model = tiny16();
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      const std::string mb = ",microbatches=" + std::to_string(m);
      // AF-Pipe: p/2 attention and p/2 FFN pipeline ranks (strategy pp = p/2), each run by dp=2 ranks.
      const std::string side = std::to_string(p);
      for (const std::string& text : {"dp=2,ep=2,schedule=dualpipev,pp=" + std::to_string(p) + mb,
                                      "dp=2,ep=2,schedule=af-pipe,disagg=1,attn_ranks=" + side + ",ffn_ranks=" + side +
                                          ",pp=" + std::to_string(p / 2) + mb}) {
        Strategy s = strategy(text);
        CompileOptions o;
        o.verify_each_pass = p <= 4;  // the graph verifier after every pass costs more than the compile
        auto r = compile_strategy(model, train_for(s), s, o);
        ASSERT_TRUE(r.ok()) << text << ": " << r.status().message();
        EXPECT_EQ(r->plan.templates.size(), static_cast<size_t>(p)) << text;
        EXPECT_EQ(r->plan.world_size, s.world_size()) << text;
        size_t p2p = 0;
        for (const auto& prog : r->plan.templates) {
          for (const auto& st : prog.streams) {
            for (const auto& in : st.instrs) p2p += in.op == OpKind::kSend;
          }
        }
        EXPECT_GT(p2p, 0u) << text;  // the verifier really had blocking pairs to match
      }
    }
  }
}

// ZeRO-3 prefetches one chunk ahead: the gathered parameters add at most a few chunks' worth to the peak.
TEST(CompileTest, Zero3GathersAreWindowedNotAllAhead) {
  auto z3 = compile("dp=4,pp=2,zero=3,schedule=1f1b,microbatches=4");
  auto z2 = compile("dp=4,pp=2,zero=2,schedule=1f1b,microbatches=4");
  ASSERT_TRUE(z3.ok() && z2.ok());
  for (size_t t = 0; t < 2; ++t) {
    int64_t largest = 0, gathered = 0;
    for (const auto& st : z3->plan.templates[t].streams) {
      for (const auto& in : st.instrs) {
        if (in.op == OpKind::kAlloc && in.label.rfind("alloc params", 0) == 0) {
          largest = std::max(largest, in.bytes);
          gathered += in.bytes;
        }
      }
    }
    ASSERT_GT(largest, 0);
    const int64_t extra = (z3->stats.peak_bytes[t] - z3->plan.templates[t].static_bytes) -
                          (z2->stats.peak_bytes[t] - z2->plan.templates[t].static_bytes);
    EXPECT_LE(extra, 3 * largest) << "template " << t;
    EXPECT_LT(extra, gathered / 4) << "template " << t;  // far from gathering every microbatch's copy up front
  }
}

// Uneven attention:FFN splits: pp attention and ffn_ranks / dp FFN pipeline ranks of dp ranks each, layer l's
// attention on attention rank l mod pp, its FFN part on FFN rank pp + l mod f; verified deadlock-free.
TEST(CompileTest, DisaggregationCompilesUnevenSplits) {
  struct Case {
    const char* text;
    int attn_pp, ffn_pp;
  };
  for (const Case& c : {Case{"dp=1,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=1,ffn_ranks=3", 1, 3},
                        Case{"dp=1,pp=2,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=1", 2, 1},
                        Case{"dp=2,ep=2,pp=2,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=4,ffn_ranks=2", 2, 1},
                        Case{"dp=2,ep=2,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=6,"
                             "zero=3,recompute=full",
                             1, 3}}) {
    Strategy s = strategy(c.text);
    CompileOptions o;
    o.verify_each_pass = true;
    auto r = compile_strategy(tiny(), train_for(s), s, o);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().message();
    EXPECT_EQ(r->plan.mesh.pp, c.attn_pp + c.ffn_pp) << c.text;
    EXPECT_EQ(r->plan.mesh.num_stages(), 2 * tiny().num_layers) << c.text;
    EXPECT_EQ(r->plan.world_size, s.attn_ranks + s.ffn_ranks) << c.text;
    for (const ir::Node& n : r->graph.nodes()) {
      if (n.kind != ir::NodeKind::kChunk || n.tags.layer < 0) continue;
      const bool ffn =
          n.tags.part == "experts" || n.tags.part == "shared" || n.tags.part == "mlp" || n.tags.part == "head";
      const int want = ffn ? c.attn_pp + n.tags.layer % c.ffn_pp : n.tags.layer % c.attn_pp;
      EXPECT_EQ(n.pp_rank, want) << c.text << " " << n.name;
    }
  }
  auto r = compile("dp=2,ep=2,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=6");
  EXPECT_TRUE(r.ok()) << r.status().message();
  r = compile("dp=4,ep=2,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=4,ffn_ranks=6");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("set ffn_ranks=8"), std::string::npos) << r.status().message();
}

TEST(CompileTest, DisaggregationUsesM2N) {
  auto r = compile("dp=2,ep=2,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=2");
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

// af-pipe with tp (sequence parallel): a chunk's tp collectives run on its own side (the dense MLP's and the head's
// on the FFN ranks), every edge between the sides is an m2n pair (none a pipeline send/recv), each carrying a
// rank's token slice (1/tp of the tp=1 plan's bytes), and Plan::m2n_peers pairs ranks of one tp coordinate.
TEST(CompileTest, DisaggregationWithTensorParallelism) {
  for (const char* t : {"dp=1,tp=2,sp=1,pp=1,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=2,ffn_ranks=4",
                        "dp=2,tp=2,sp=1,ep=2,pp=1,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=4,ffn_ranks=4"}) {
    auto r = compile(t);
    ASSERT_TRUE(r.ok()) << t << ": " << r.status().message();
    const Plan& plan = r->plan;
    for (const auto& p : plan.templates) {
      for (const auto& st : p.streams) {
        for (const auto& in : st.instrs) {
          EXPECT_NE(in.role, CommRole::kPipeline) << t << ": " << in.label;
          const bool ffn_part =
              in.label.find("mlp.tp_") != std::string::npos || in.label.find("head.tp_") != std::string::npos;
          if (in.op == OpKind::kCollective && ffn_part) {
            EXPECT_GE(p.pp_rank, 1) << t << ": " << in.label;
          }
        }
      }
    }
  }
  // Bytes: the tp=2 plan's m2n instructions carry half the tp=1 plan's (same dp, same split per tp coordinate).
  auto one = compile("dp=1,pp=1,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=1,ffn_ranks=1");
  auto two = compile("dp=1,tp=2,sp=1,pp=1,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=2,ffn_ranks=2");
  ASSERT_TRUE(one.ok() && two.ok());
  std::map<std::string, int64_t> bytes_one;
  for (const auto& st : one->plan.templates[0].streams) {
    for (const auto& in : st.instrs) {
      if (in.comm == ir::NodeKind::kM2N) bytes_one[in.label] = in.comm_bytes;
    }
  }
  size_t m2n = 0;
  for (const auto& st : two->plan.templates[0].streams) {
    for (const auto& in : st.instrs) {
      if (in.comm != ir::NodeKind::kM2N || in.role == CommRole::kM2NDense) continue;
      ++m2n;
      // The routed exchanges keep their labels (chunk to chunk, or experts to the next attention's all-gather).
      std::string label = in.label;
      for (const char* c : {".tp_ag", ".tp_rs"}) {
        if (size_t at = label.find(c); at != std::string::npos) label.erase(at, 6);
      }
      ASSERT_TRUE(bytes_one.count(label)) << in.label;
      EXPECT_EQ(2 * in.comm_bytes, bytes_one[label]) << in.label;
    }
  }
  EXPECT_GT(m2n, 0u);
  // Rank (attention, dp 1, tp 1) of dp=2 x tp=2 x ep=2 exchanges with the FFN ranks (dp 0 and 1, tp 1).
  auto tp_ep = compile("dp=2,tp=2,sp=1,ep=2,pp=1,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=4,ffn_ranks=4");
  ASSERT_TRUE(tp_ep.ok());
  const Plan& p = tp_ep->plan;
  const int me = p.rank_of(RankCoord{0, 1, 1, 1});
  EXPECT_EQ(p.m2n_peers(me, 1), (std::vector<int>{p.rank_of(RankCoord{1, 0, 0, 1}), p.rank_of(RankCoord{1, 1, 1, 1})}));
}

TEST(CompileTest, DirectiveFileAndBuiltinScheduleGiveIdenticalPlans) {
  for (const char* text :
       {"dp=4,pp=2,ep=2,zero=3,schedule=1f1b,microbatches=4", "dp=2,pp=2,schedule=dualpipev,microbatches=4",
        "dp=2,ep=2,pp=1,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=2",
        "dp=1,pp=2,schedule=af-pipe,microbatches=4,disagg=1,attn_ranks=2,ffn_ranks=1"}) {
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

// The CPU runtime's target and the megatron target (the simulator's) lower a strategy to the same plan: both gather ZeRO-1/2 parameters before the next step's forward (the all-gather has no input, it feeds the
// group's first forward), so `piper train` runs the plan `piper simulate` times.
TEST(CompileTest, CpuRuntimeTargetGathersZeroParamsBeforeTheForwardLikeMegatron) {
  for (const char* text : {"dp=2,zero=1,microbatches=2", "dp=2,pp=2,zero=2,schedule=1f1b,microbatches=4",
                           "dp=4,ep=2,zero=1,microbatches=2"}) {
    CompileOptions cpu;
    cpu.target = cpu_runtime_target();
    auto runtime = compile(text, cpu);
    ASSERT_TRUE(runtime.ok()) << runtime.status().message();
    auto megatron = compile(text);
    ASSERT_TRUE(megatron.ok()) << megatron.status().message();
    EXPECT_EQ(plan_hash(runtime->plan), plan_hash(megatron->plan)) << text;
    int gathers = 0;
    for (const Program& p : runtime->plan.templates) {
      for (const Stream& st : p.streams) {
        for (const Instruction& in : st.instrs) {
          if (in.role != CommRole::kParamGather) continue;
          ++gathers;
          EXPECT_TRUE(in.inputs.empty()) << text << ": " << in.label << " waits for the update";
          EXPECT_FALSE(in.outputs.empty()) << text << ": " << in.label << " feeds no forward";
        }
      }
    }
    EXPECT_GT(gathers, 0) << text;
  }
}

// The CPU runtime's target splits the embedding and the head over tp as the megatron target does (vocabulary
// parallelism), with ZeRO-1/2's parameter gather before the forward in both: `piper train` and `piper simulate`
// compile the same plan; the embed and head computes are tp-sharded in both.
TEST(CompileTest, CpuRuntimeAndMegatronTargetsCompileTheSamePlanUnderTp) {
  for (const char* text : {"tp=2,sp=1,microbatches=2", "dp=2,pp=2,tp=2,sp=1,zero=3,schedule=1f1b,microbatches=4",
                           "dp=2,tp=2,sp=1,zero=1,microbatches=2",
                           "dp=1,tp=2,sp=1,pp=1,schedule=af-pipe,microbatches=2,disagg=1,attn_ranks=2,ffn_ranks=2"}) {
    CompileOptions cpu;
    cpu.target = cpu_runtime_target();
    auto sim = compile(text), train = compile(text, cpu);
    ASSERT_TRUE(sim.ok() && train.ok()) << text;
    EXPECT_EQ(sim->plan.to_json(), train->plan.to_json()) << text;
    std::set<std::string> split;
    for (const Program& p : train->plan.templates) {
      for (const Stream& st : p.streams) {
        for (const Instruction& in : st.instrs) {
          if (in.op == OpKind::kCompute && in.shard_axis == "tp" && in.part) split.insert(chunk_name(*in.part));
        }
      }
    }
    EXPECT_TRUE(split.count("embed") && split.count("head")) << text;
  }
}

// Expert tensor parallelism without expert parallelism (ep=1, etp=2): the experts are sharded and sliced over etp,
// with the etp gather and reduce-scatter around every experts chunk (F and B) and no all-to-all; the experts'
// gradients are reduced over edp (dp*tp/etp ranks).
TEST(CompileTest, EtpWithoutEpLowersTheEtpExchangesAlone) {
  auto r = compile("dp=2,tp=2,sp=1,etp=2,microbatches=2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->plan.mesh.etp, 2);
  EXPECT_EQ(r->plan.mesh.ep, 1);
  size_t gathers = 0, scatters = 0, all_to_alls = 0;
  for (const auto& st : r->plan.templates[0].streams) {
    for (const auto& in : st.instrs) {
      gathers += in.role == CommRole::kEtpGather;
      scatters += in.role == CommRole::kEtpScatter;
      all_to_alls += in.comm == ir::NodeKind::kAllToAll;
    }
  }
  // tiny-moe: 3 MoE layers (of 4) x 2 microbatches x (F + B).
  EXPECT_EQ(gathers, 12u);
  EXPECT_EQ(scatters, 12u);
  EXPECT_EQ(all_to_alls, 0u);
}

// The experts' gradient reductions of pipeline rank 0's program, by group ("dp", "edp", ...).
std::map<std::string, size_t> expert_reductions(const Plan& plan) {
  std::map<std::string, size_t> out;
  for (const auto& st : plan.templates[0].streams) {
    for (const auto& in : st.instrs) {
      if (in.op == OpKind::kCollective && in.part == Part::kExperts &&
          (in.comm == ir::NodeKind::kAllReduce || in.comm == ir::NodeKind::kReduceScatter)) {
        ++out[in.group];
      }
    }
  }
  return out;
}

// Under sequence parallelism each tensor rank's experts (etp = 1: whole) see its T / tp tokens, so their gradients
// are partial sums over tp: the compiler reduces them over the plan's edp group, dp x tp / ep ranks (Megatron's
// expert-data-parallel group), ZeRO or not, ep = 1 or not, and with dp = 1 too (over the tensor ranks alone).
// Issue 27: the plan reduced them over dp and the runtime summed them over tp in a blocking all-reduce of its own.
TEST(CompileTest, SequenceParallelReducesTheExpertsOverDpTimesTp) {
  struct Case {
    const char* strategy;
    std::vector<int> edp;  // rank 0's edp group
    size_t reductions;     // rank 0's experts reductions (3 MoE layers; ZeRO-2/3: per microbatch)
  };
  for (const Case& c :
       {Case{"dp=2,tp=2,sp=1,microbatches=2", {0, 1, 2, 3}, 3},
        Case{"dp=2,tp=2,sp=1,zero=1,microbatches=2", {0, 1, 2, 3}, 3},
        Case{"dp=2,tp=2,sp=1,zero=3,microbatches=2", {0, 1, 2, 3}, 6}, Case{"dp=1,tp=2,sp=1,microbatches=2", {0, 1}, 3},
        Case{"dp=4,tp=2,sp=1,ep=2,microbatches=2", {0, 1, 4, 5}, 3}}) {
    SCOPED_TRACE(c.strategy);
    auto r = compile(c.strategy);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->plan.experts_reduce_over_edp());
    auto edp = r->plan.group_ranks(0, "edp");
    ASSERT_TRUE(edp.ok());
    EXPECT_EQ(*edp, c.edp);
    EXPECT_EQ(static_cast<int>(c.edp.size()), r->plan.mesh.expert_replicas());
    const auto reductions = expert_reductions(r->plan);
    EXPECT_EQ(reductions.count("dp"), 0u);
    EXPECT_EQ(reductions.count("edp") ? reductions.at("edp") : 0u, c.reductions);
  }
  // Without tensor parallelism the experts (ep = 1) stay data-parallel chunks, reduced over dp.
  auto plain = compile("dp=2,microbatches=2");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_FALSE(plain->plan.experts_reduce_over_edp());
  EXPECT_EQ(expert_reductions(plain->plan), (std::map<std::string, size_t>{{"dp", 3}}));
}

// A plan that reduces the experts against the rule is refused by the verifier, naming the instruction.
TEST(CompileTest, VerifierRefusesExpertReductionsAgainstTheRule) {
  auto r = compile("dp=2,tp=2,sp=1,microbatches=2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto retarget = [](Plan plan, const std::string& group) {
    for (auto& st : plan.templates[0].streams) {
      for (auto& in : st.instrs) {
        if (in.op == OpKind::kCollective && in.part == Part::kExperts && in.group == "edp") in.group = group;
      }
    }
    return plan;
  };
  auto over_dp = verify_plan(retarget(r->plan, "dp"));
  ASSERT_FALSE(over_dp.ok());
  EXPECT_NE(over_dp.status().message().find("reduces the experts' gradients over dp"), std::string::npos)
      << over_dp.status().message();
  EXPECT_NE(over_dp.status().message().find("sequence parallelism"), std::string::npos);
  auto over_tp = verify_plan(retarget(r->plan, "tp"));
  ASSERT_FALSE(over_tp.ok());
  EXPECT_NE(over_tp.status().message().find("without reducing their gradients over edp (4 ranks"), std::string::npos)
      << over_tp.status().message();
  EXPECT_TRUE(verify_plan(r->plan).ok());
}

// Pipeline rank 0's tp gradient sums (CommRole::kTpGradSum): their chunk's label -> comm_bytes.
std::map<std::string, int64_t> tp_grad_sums(const Plan& plan) {
  std::map<std::string, int64_t> out;
  for (const auto& st : plan.templates[0].streams) {
    for (const auto& in : st.instrs) {
      if (in.role != CommRole::kTpGradSum) continue;
      EXPECT_EQ(in.comm, ir::NodeKind::kAllReduce) << in.label;
      EXPECT_EQ(in.group, "tp") << in.label;
      EXPECT_LT(in.mb, 0) << in.label;
      EXPECT_TRUE(out.emplace(in.label, in.comm_bytes).second) << in.label << " twice";
    }
  }
  return out;
}

// With tp > 1 the gradients that are partial on each tensor rank are summed over tp by the plan, one all_reduce per
// chunk before its update: a split chunk's norm weight (tiny-moe: hidden 128 fp32 gradients, 512 bytes), and under
// sequence parallelism every tensor of the unsplit routers ((128 x 8 + 128) x 4 = 4608 bytes); never the experts
// (reduced over edp), nor the split embedding (nothing whole). Under ZeRO the sum runs on the dp shard (bytes / dp).
// Issue 27: the runtime summed them in a blocking all-reduce of its own that no instruction priced.
// Under ZeRO-2 each chunk's per-microbatch gradient is a buffer until its reduce-scatter has sent it; the tp sum
// that sits between that reduce-scatter and the update must not hide it (memory_plan.cc feeds_sharded_update).
TEST(CompileTest, ZeroTwoGradientBuffersSurviveTheTpSum) {
  auto grad_buffers = [](const Plan& plan) {
    int n = 0;
    for (const auto& st : plan.templates[0].streams) {
      for (const auto& in : st.instrs) n += in.op == OpKind::kAlloc && in.label.rfind("alloc grads ", 0) == 0;
    }
    return n;
  };
  auto without_tp = compile("dp=2,zero=2,microbatches=2");
  auto with_tp = compile("dp=2,tp=2,sp=1,zero=2,microbatches=2");
  ASSERT_TRUE(without_tp.ok()) << without_tp.status().message();
  ASSERT_TRUE(with_tp.ok()) << with_tp.status().message();
  EXPECT_GT(grad_buffers(without_tp->plan), 0);
  EXPECT_EQ(grad_buffers(with_tp->plan), grad_buffers(without_tp->plan));
}

TEST(CompileTest, TensorParallelPlansSumThePartialGradientsOverTp) {
  std::map<std::string, int64_t> sp;
  for (const char* l : {"L0.attn", "L0.mlp", "L1.attn", "L2.attn", "L3.attn", "head"})
    sp[std::string(l) + ".tp_sum"] = 512;
  for (const char* l : {"L1.router", "L2.router", "L3.router"}) sp[std::string(l) + ".tp_sum"] = 4608;
  auto r = compile("dp=2,tp=2,sp=1,microbatches=2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(tp_grad_sums(r->plan), sp);
  auto one_dp = compile("tp=2,sp=1,microbatches=2");
  ASSERT_TRUE(one_dp.ok()) << one_dp.status().message();
  EXPECT_EQ(tp_grad_sums(one_dp->plan), sp);
  auto zero = compile("dp=2,tp=2,sp=1,zero=2,microbatches=2");
  ASSERT_TRUE(zero.ok()) << zero.status().message();
  std::map<std::string, int64_t> shard = sp;
  for (auto& [label, bytes] : shard) bytes /= 2;
  EXPECT_EQ(tp_grad_sums(zero->plan), shard);
  // Each sum runs after its chunk's data-parallel reduction and before its update.
  for (const auto& st : r->plan.templates[0].streams) {
    for (const auto& in : st.instrs) {
      if (in.role != CommRole::kTpGradSum) continue;
      ASSERT_EQ(in.inputs.size(), 1u) << in.label;
      ASSERT_EQ(in.outputs.size(), 1u) << in.label;
      bool reduce = false, update = false;
      for (const auto& s2 : r->plan.templates[0].streams) {
        for (const auto& o : s2.instrs) {
          reduce |= o.node == in.inputs[0] && o.role == CommRole::kGradReduce && o.part == in.part;
          update |= o.node == in.outputs[0] && o.op == OpKind::kUpdate && o.part == in.part && o.layer == in.layer;
        }
      }
      EXPECT_TRUE(reduce && update) << in.label;
    }
  }
  // tp without sequence parallelism (a dense model): only the split chunks' norm weights are partial.
  const Strategy s = strategy("tp=2,sp=0,microbatches=2");
  ModelSpec dense = tiny();
  dense.moe = MoeSpec{};
  auto no_sp = compile_strategy(dense, train_for(s), s, CompileOptions{});
  ASSERT_TRUE(no_sp.ok()) << no_sp.status().message();
  std::map<std::string, int64_t> norms{{"head.tp_sum", 512}};
  for (int l = 0; l < 4; ++l) {
    norms["L" + std::to_string(l) + ".attn.tp_sum"] = 512;
    norms["L" + std::to_string(l) + ".mlp.tp_sum"] = 512;
  }
  EXPECT_EQ(tp_grad_sums(no_sp->plan), norms);
  // Without tensor parallelism nothing is partial.
  auto plain = compile("dp=2,microbatches=2");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_TRUE(tp_grad_sums(plain->plan).empty());
}

// A plan without a chunk's tp gradient sum, or with one for a chunk whose gradients are whole, is refused by the
// verifier, naming the chunk or the instruction.
TEST(CompileTest, VerifierRefusesMissingOrExtraTpGradSums) {
  auto r = compile("dp=2,tp=2,sp=1,microbatches=2");
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(verify_plan(r->plan).ok());
  Plan missing = r->plan;
  for (auto& st : missing.templates[0].streams) {
    std::erase_if(st.instrs, [](const Instruction& in) { return in.label == "L2.router.tp_sum"; });
  }
  auto m = verify_plan(missing);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("updates (layer 2, router) without summing over tp"), std::string::npos)
      << m.status().message();
  Plan extra = r->plan;
  for (auto& st : extra.templates[0].streams) {
    for (auto& in : st.instrs) {
      if (in.label == "L2.router.tp_sum") in.part = Part::kExperts;
    }
  }
  auto e = verify_plan(extra);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("'L2.router.tp_sum' sums over tp the gradients of (layer 2, experts), which are "
                                      "whole on every tensor rank"),
            std::string::npos)
      << e.status().message();
  // A hand-edited plan whose sum reads another chunk's gradient, or that its update does not read.
  for (const bool inputs : {true, false}) {
    Plan rewired = r->plan;
    ir::NodeId attn_w = ir::kNoNode;
    for (const auto& st : rewired.templates[0].streams) {
      for (const auto& in : st.instrs) {
        if (in.label == "L2.attn.BW.mb1") attn_w = in.node;
      }
    }
    ASSERT_NE(attn_w, ir::kNoNode);
    for (auto& st : rewired.templates[0].streams) {
      for (auto& in : st.instrs) {
        if (in.label != "L2.router.tp_sum") continue;
        if (inputs) in.inputs = {attn_w};
        else in.outputs.clear();
      }
    }
    auto w = verify_plan(rewired);
    ASSERT_FALSE(w.ok()) << (inputs ? "inputs" : "outputs");
    EXPECT_NE(w.status().message().find(inputs ? "does not read only that chunk's weight-gradient tasks"
                                               : "its update does not read it"),
              std::string::npos)
        << w.status().message();
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

// A mesh with etp > 1 whose directives leave the experts unsharded would slice them with no etp exchange: refused.
// (dp=2: with dp=1 the strategy's only replicate is the experts' over the tensor ranks, which etp=2 leaves empty.)
TEST(CompileTest, EtpMeshWithUnshardedExpertsIsRefused) {
  const Strategy s = strategy("dp=2,tp=2,sp=1,microbatches=2");
  auto directives = strategy_directives(s, tiny());
  ASSERT_TRUE(directives.ok()) << directives.status().message();
  auto mesh = strategy_mesh(s, tiny());
  ASSERT_TRUE(mesh.ok());
  mesh->etp = 2;
  auto r = compile_directives(tiny(), train_for(s), *mesh, *directives);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the mesh has etp=2 but"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("shard directive with axis ep on the experts or set etp=1"), std::string::npos)
      << r.status().message();
}

// A directive file written for pp=2, compiled with --mesh pp=4: ranks 2 and 3 were left empty and the plan was
// reported "verified deadlock-free". Refused, naming both meshes; the file's own mesh still compiles.
TEST(CompileTest, DirectivesForAnotherMeshAreRefused) {
  const Strategy s = strategy("pp=2,microbatches=2");
  auto directives = strategy_directives(s, tiny());
  ASSERT_TRUE(directives.ok()) << directives.status().message();
  ir::MeshInfo pp4;
  pp4.pp = 4;
  auto r = compile_directives(tiny(), train_for(s), pp4, *directives);
  ASSERT_FALSE(r.ok());
  const std::string e = r.status().message();
  EXPECT_NE(e.find("the directives place the model on pipeline ranks 0..1 (2 stages: written for pp=2) but the "
                   "mesh has pp=4, vpp=1: pipeline rank(s) 2, 3 would have no work"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--mesh pp=2"), std::string::npos) << e;
  EXPECT_TRUE(compile_directives(tiny(), train_for(s), mesh_pp2(), *directives).ok());
  // A rank left out in the middle of the mesh is named too.
  ir::MeshInfo pp3;
  pp3.pp = 3;
  r = compile_directives(tiny(), train_for(s), pp3, parse(R"([
    {"directive": "split", "microbatches": 2},
    {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0, "rank": 0},
    {"directive": "place", "filter": {"layer": "2-3"}, "stage": 2, "rank": 2}])"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("leave pipeline rank(s) 1 of the mesh pp=3 without work"), std::string::npos)
      << r.status().message();
  // A file for vpp=1 under vpp=2: every rank busy, but stages 2 and 3 would hold no layer.
  ir::MeshInfo vpp2 = mesh_pp2();
  vpp2.vpp = 2;
  r = compile_directives(tiny(), train_for(s), vpp2, *directives);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the mesh has pp=2, vpp=2 = 4 stages: stage(s) 2, 3 would hold no layer"),
            std::string::npos)
      << r.status().message();
}

// Rank 1 wants microbatch 1 first while rank 0 sends microbatch 0 first. Each channel (ordered rank pair) has its
// own streams and posts its receives in the sender's order (NCCL matches a rank pair's point-to-point calls in
// issue order), so rank 1 receives mb0, then mb1, and runs F1 as soon as mb1 has arrived: no deadlock.
TEST(CompileTest, ReceivesArePostedInTheSendersOrder) {
  TrainSpec t = train_for(strategy("pp=2"));
  auto r = compile_directives(tiny(), t, mesh_pp2(), parse(R"([
    {"directive": "split", "microbatches": 2},
    {"directive": "place", "filter": {"layer": "0-1"}, "stage": 0, "rank": 0},
    {"directive": "place", "filter": {"layer": "2-3"}, "stage": 1, "rank": 1},
    {"directive": "order", "rank": 0, "slots": ["0F0", "0F1", "0BW0", "0BW1"]},
    {"directive": "order", "rank": 1, "slots": ["1F1", "1BW1", "1F0", "1BW0"]}])"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::vector<int> recv_mbs, compute_mbs;
  for (const Stream& st : r->plan.templates[1].streams) {
    for (const Instruction& in : st.instrs) {
      if (st.name == "p2p_from_0" && in.op == OpKind::kRecv) recv_mbs.push_back(in.mb);
      if (st.name == "compute" && in.op == OpKind::kCompute && in.label.find(".F.") != std::string::npos) {
        compute_mbs.push_back(in.mb);
      }
    }
  }
  EXPECT_EQ(recv_mbs, (std::vector<int>{0, 1}));
  ASSERT_FALSE(compute_mbs.empty());
  EXPECT_EQ(compute_mbs.front(), 1);
}

Instruction p2p(OpKind op, int peer, int64_t tag, const std::string& label) {
  Instruction in;
  in.op = op;
  in.peer = peer;
  in.tag = tag;
  in.label = label;
  return in;
}

// Two ranks that each receive before they send: a real blocking deadlock, reported with rank, stream and
// instruction.
TEST(CompileTest, VerifierFindsBlockingDeadlock) {
  Plan plan;
  plan.mesh = mesh_pp2();
  plan.world_size = 2;
  plan.rank_template = {0, 1};
  plan.templates.resize(2);
  for (int r = 0; r < 2; ++r) {
    plan.templates[static_cast<size_t>(r)].pp_rank = r;
    Stream st;
    st.name = "pair";
    st.instrs.push_back(p2p(OpKind::kRecv, 1 - r, 1 - r, "x"));
    st.instrs.push_back(p2p(OpKind::kSend, 1 - r, r, "y"));
    plan.templates[static_cast<size_t>(r)].streams.push_back(st);
  }
  auto s = verify_plan(plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("deadlock"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("rank 0 stream 'pair' instruction 0 (recv x) is blocked"), std::string::npos)
      << s.status().message();
  // Swapping rank 1's two instructions resolves it.
  std::swap(plan.templates[1].streams[0].instrs[0], plan.templates[1].streams[0].instrs[1]);
  EXPECT_TRUE(verify_plan(plan).ok());
  // A send whose receive is missing is named.
  plan.templates[1].streams[0].instrs.pop_back();
  s = verify_plan(plan);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("send has no matching receive on rank 1"), std::string::npos)
      << s.status().message();
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
