// CompileOptions::data_edges = false (the planner's verification and re-scoring compiles): the same plan but for
// Instruction::inputs and outputs, which stay empty, and the same verifier statistics.
#include <gtest/gtest.h>

#include <string>

#include "piper/compile/compile.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/strategy.h"

namespace piper::compile {
namespace {

TEST(DataEdgesTest, WithoutDataEdgesThePlanIsTheSameButForInputsAndOutputs) {
  auto model = load_model("deepseek-v2-lite");
  ASSERT_TRUE(model.ok());
  for (const std::string text :
       {"dp=4,tp=2,pp=2,ep=4,sp=1,zero=1,schedule=1f1b,microbatches=4",
        "dp=4,tp=2,pp=2,ep=2,sp=1,zero=3,schedule=dualpipev,microbatches=8,recompute=selective",
        "dp=2,tp=2,pp=4,ep=2,sp=1,zero=2,schedule=zb-h1,microbatches=8,mbs=2,tp_overlap=1",
        "dp=2,tp=1,pp=4,vpp=2,ep=2,zero=1,schedule=interleaved,microbatches=8"}) {
    auto s = Strategy::parse(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status().message();
    TrainSpec train;
    train.seq_len = 1024;
    train.micro_batch_size = s->mbs;
    train.global_batch = s->global_batch();
    CompileOptions with, without;
    with.capacity_bytes = without.capacity_bytes = int64_t{1} << 50;
    without.data_edges = false;
    auto a = compile_strategy(*model, train, *s, with);
    auto b = compile_strategy(*model, train, *s, without);
    ASSERT_TRUE(a.ok() && b.ok()) << text << ": " << (a.ok() ? b.status() : a.status()).message();
    EXPECT_EQ(a->stats.peak_bytes, b->stats.peak_bytes) << text;
    EXPECT_EQ(a->stats.instructions, b->stats.instructions) << text;
    size_t edges = 0;
    for (Program& prog : a->plan.templates) {
      for (Stream& st : prog.streams) {
        for (Instruction& in : st.instrs) {
          edges += in.inputs.size() + in.outputs.size();
          in.inputs.clear();
          in.outputs.clear();
        }
      }
    }
    EXPECT_GT(edges, 0u) << text << ": no data edges to leave out; the test sees nothing";
    EXPECT_TRUE(a->plan == b->plan) << text;
  }
}

}  // namespace
}  // namespace piper::compile
