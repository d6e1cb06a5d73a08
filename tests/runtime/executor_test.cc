// The Plan-executed step equals the sequential reference composition of the same chunks: same loss, same
// gradients, for 1F1B, GPipe and the B/W-split zb-h1 order; and the executor's input checks.
#include "piper/runtime/exec/executor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "piper/compile/compile.h"
#include "piper/compile/strategy_directives.h"
#include "piper/runtime/exec/trace.h"
#include "reference_step.h"

namespace piper::runtime::testing {
namespace {

TrainSpec fp32_train(int64_t global_batch, int64_t mbs, int64_t seq) {
  TrainSpec t;
  t.global_batch = global_batch;
  t.micro_batch_size = mbs;
  t.seq_len = seq;
  t.param_dtype = t.grad_dtype = t.master_dtype = t.optimizer_dtype = t.activation_dtype = DType::kFP32;
  return t;
}

struct Setup {
  MemoryTracker tracker;
  TrackingAllocator alloc{&tracker};
  compile::CompileResult compiled;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Executor> executor;
};

std::unique_ptr<Setup> make_setup(const ModelSpec& spec, const std::string& strategy, uint64_t seed) {
  auto s = std::make_unique<Setup>();
  Strategy st = Strategy::parse(strategy).value();
  s->compiled = compile::compile_strategy(spec, fp32_train(st.global_batch(), st.mbs, 8), st).value();
  s->model = Model::create(spec, {}, seed, &s->alloc).value();
  s->optimizer = std::make_unique<Optimizer>(OptimizerSpec{}, 0, *s->model, &s->alloc);
  auto ex = Executor::create(s->compiled.plan, s->compiled.plan.program(0), s->model.get(), s->optimizer.get(),
                             &s->alloc);
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  if (ex.ok()) s->executor = std::move(ex).value();
  return s;
}

int count_pass(const compile::Program& p, ir::Pass pass) {
  int n = 0;
  for (const auto& s : p.streams) {
    for (const auto& in : s.instrs) n += in.op == compile::OpKind::kCompute && in.pass == pass ? 1 : 0;
  }
  return n;
}

void expect_matches_reference(const std::string& strategy, bool shared_expert) {
  SCOPED_TRACE(strategy);
  const ModelSpec spec = small_moe_spec(shared_expert);
  auto s = make_setup(spec, strategy, 5);
  ASSERT_NE(s->executor, nullptr);
  const int m = s->executor->num_microbatches();
  const Batch batch = random_batch(4, 8, spec.vocab_size, 21);
  auto r = s->executor->run_step(batch);
  ASSERT_TRUE(r.ok()) << r.status().to_string();

  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  auto ref_model = Model::create(spec, {}, 5, &alloc).value();
  ReferenceResult ref = reference_step(*ref_model, batch, m, &alloc);
  EXPECT_EQ(r->loss, ref.loss);
  EXPECT_EQ(r->aux_loss, ref.aux_loss);
  EXPECT_GT(r->grad_norm, 0.0);
  auto a = s->model->params();
  auto b = ref_model->params();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i]->trainable) continue;
    ASSERT_EQ(a[i]->grad.numel(), b[i]->grad.numel());
    EXPECT_EQ(std::memcmp(a[i]->grad.data(), b[i]->grad.data(), static_cast<size_t>(a[i]->grad.nbytes())), 0)
        << a[i]->name << " gradient differs from the reference";
  }
}

TEST(ExecutorTest, OneFOneBStepEqualsSequentialReference) {
  expect_matches_reference("schedule=1f1b,microbatches=2,mbs=2", true);
}

TEST(ExecutorTest, GPipeStepEqualsSequentialReference) {
  expect_matches_reference("schedule=gpipe,microbatches=4,mbs=1", false);
}

TEST(ExecutorTest, ZeroBubbleSplitBackwardEqualsSequentialReference) {
  auto s = make_setup(small_moe_spec(true), "schedule=zb-h1,microbatches=2,mbs=2", 5);
  ASSERT_NE(s->executor, nullptr);
  const compile::Program& p = s->compiled.plan.program(0);
  EXPECT_GT(count_pass(p, ir::Pass::kB), 0) << "zb-h1 should split the backward into B and W";
  EXPECT_EQ(count_pass(p, ir::Pass::kB), count_pass(p, ir::Pass::kW));
  expect_matches_reference("schedule=zb-h1,microbatches=2,mbs=2", true);
}

// Recomputation: the plan frees each recomputed chunk's stash right after F and re-runs F before its backward.
TEST(ExecutorTest, FullRecomputeStepEqualsSequentialReference) {
  auto s = make_setup(small_moe_spec(true), "schedule=1f1b,microbatches=2,mbs=2,recompute=full", 5);
  ASSERT_NE(s->executor, nullptr);
  int reruns = 0;
  for (const auto& st : s->compiled.plan.program(0).streams) {
    for (const auto& in : st.instrs) reruns += in.label.find("(recompute)") != std::string::npos ? 1 : 0;
  }
  EXPECT_GT(reruns, 0) << "recompute=full should re-run forwards";
  expect_matches_reference("schedule=1f1b,microbatches=2,mbs=2,recompute=full", true);
  expect_matches_reference("schedule=gpipe,microbatches=2,mbs=2,recompute=selective", false);
}

// DeepSeek-style sigmoid router with the aux-loss-free bias: gradients match the reference, and the bias moves
// after the update (it only changes which experts are chosen).
TEST(ExecutorTest, SigmoidRouterWithBalancingBias) {
  ModelSpec spec = small_moe_spec(true);
  spec.moe.router = RouterType::kSigmoid;
  spec.moe.router_bias = true;
  SCOPED_TRACE("sigmoid + bias");
  auto s = make_setup(spec, "schedule=1f1b,microbatches=2,mbs=2", 9);
  ASSERT_NE(s->executor, nullptr);
  const Batch batch = random_batch(4, 8, spec.vocab_size, 4);
  auto r = s->executor->run_step(batch);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->aux_loss, 0.0);  // no Switch loss when the bias balances
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  auto ref_model = Model::create(spec, {}, 9, &alloc).value();
  ReferenceResult ref = reference_step(*ref_model, batch, 2, &alloc);
  EXPECT_EQ(r->loss, ref.loss);
  const Param* bias = nullptr;
  for (const Param* p : s->model->params()) {
    if (p->name == "L1.router.bias") bias = p;
  }
  ASSERT_NE(bias, nullptr);
  EXPECT_FALSE(bias->trainable);
  double moved = 0;
  for (int64_t e = 0; e < bias->value.numel(); ++e) moved += std::fabs(bias->value[e]);
  EXPECT_GT(moved, 0.0) << "the balancing bias should move after a step";
}

TEST(ExecutorTest, ParametersChangeAndLossDropsOnRepeatedBatch) {
  auto s = make_setup(small_moe_spec(true), "schedule=1f1b,microbatches=2,mbs=2", 3);
  ASSERT_NE(s->executor, nullptr);
  const Batch batch = random_batch(4, 8, 32, 8);
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    auto r = s->executor->run_step(batch);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (i == 0) first = r->loss;
    last = r->loss;
  }
  EXPECT_LT(last, first - 0.05);
  EXPECT_EQ(s->optimizer->step(), 8);
}

TEST(ExecutorTest, TokenIdOutOfRangeIsAClearError) {
  auto s = make_setup(small_moe_spec(true), "schedule=1f1b,microbatches=2,mbs=2", 3);
  ASSERT_NE(s->executor, nullptr);
  Batch batch = random_batch(4, 8, 32, 8);
  batch.inputs[13] = 40;
  auto r = s->executor->run_step(batch);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("token id 40"), std::string::npos) << r.status().message();
  // The executor recovers: the next valid step runs.
  batch.inputs[13] = 1;
  EXPECT_TRUE(s->executor->run_step(batch).ok());
}

TEST(ExecutorTest, BatchThatDoesNotSplitIntoMicrobatchesIsRejected) {
  auto s = make_setup(small_moe_spec(true), "schedule=1f1b,microbatches=2,mbs=2", 3);
  ASSERT_NE(s->executor, nullptr);
  auto r = s->executor->run_step(random_batch(3, 8, 32, 8));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("2 microbatches"), std::string::npos) << r.status().message();
}

// Updates on their own logical stream: the program has two streams joined by events, run on two threads; the
// update stream must wait for every gradient (global-norm clipping) and give the same bits as one stream. Both
// threads record into one trace and one memory tracker (the TSan job of scripts/ci-sanitizers.sh runs this).
TEST(ExecutorTest, UpdatesOnASecondStreamGiveTheSameBits) {
  const ModelSpec spec = small_moe_spec(true);
  Strategy st = Strategy::parse("schedule=1f1b,microbatches=2,mbs=2").value();
  const TrainSpec train = fp32_train(st.global_batch(), st.mbs, 8);
  auto directives = compile::strategy_directives(st, spec).value();
  ir::StreamDirective to_optimizer;
  to_optimizer.filter.pass = ir::Pass::kU;
  to_optimizer.stream = "optimizer";
  directives.insert(directives.begin() + 1, ir::Directive{to_optimizer});
  auto compiled = compile::compile_directives(spec, train, compile::strategy_mesh(st, spec).value(), directives);
  ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
  ASSERT_EQ(compiled->plan.program(0).streams.size(), 2u);
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  auto model = Model::create(spec, {}, 5, &alloc).value();
  Optimizer opt(OptimizerSpec{}, 0, *model, &alloc);
  auto ex = Executor::create(compiled->plan, compiled->plan.program(0), model.get(), &opt, &alloc);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  EXPECT_EQ((*ex)->num_streams(), 2);
  TraceRecorder recorder(0, 0, &tracker);
  (*ex)->set_trace(&recorder);
  recorder.start();
  auto single = make_setup(spec, "schedule=1f1b,microbatches=2,mbs=2", 5);
  ASSERT_NE(single->executor, nullptr);
  for (int i = 0; i < 3; ++i) {
    const Batch batch = random_batch(4, 8, 32, 30 + static_cast<uint64_t>(i));
    auto a = (*ex)->run_step(batch);
    auto b = single->executor->run_step(batch);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_EQ(a->grad_norm, b->grad_norm);
  }
  (*ex)->set_trace(nullptr);
  std::map<int, int> spans_per_stream;
  std::map<int, double> stream_end;
  for (const InstrSpan& sp : recorder.timeline().spans) {
    EXPECT_GE(sp.start_s, stream_end[sp.stream]) << "stream " << sp.stream << " instr " << sp.instr;
    stream_end[sp.stream] = sp.end_s;
    spans_per_stream[sp.stream]++;
  }
  for (size_t k = 0; k < 2; ++k) {  // every instruction of both threads, once per step
    const auto instrs = static_cast<int>(compiled->plan.program(0).streams[k].instrs.size());
    EXPECT_EQ(spans_per_stream[static_cast<int>(k)], 3 * instrs) << "stream " << k;
  }
  auto pa = model->params(), pb = single->model->params();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(std::memcmp(pa[i]->value.data(), pb[i]->value.data(), static_cast<size_t>(pa[i]->value.nbytes())), 0)
        << pa[i]->name;
  }
}

TEST(ExecutorTest, MultiRankProgramWithoutDistContextIsRejectedWithHint) {
  const ModelSpec spec = small_moe_spec(true);
  Strategy st = Strategy::parse("dp=2,schedule=1f1b,microbatches=1,mbs=2").value();
  auto compiled = compile::compile_strategy(spec, fp32_train(st.global_batch(), st.mbs, 8), st);
  ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
  MemoryTracker tracker;
  TrackingAllocator alloc(&tracker);
  auto model = Model::create(spec, {}, 1, &alloc).value();
  Optimizer opt(OptimizerSpec{}, 0, *model, &alloc);
  auto ex = Executor::create(compiled->plan, compiled->plan.program(0), model.get(), &opt, &alloc);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ex.status().message().find("piper train --ranks N"), std::string::npos) << ex.status().message();
}

}  // namespace
}  // namespace piper::runtime::testing
