// FP8 vs BF16, term by term (issue 32): DeepSeek-V3 on 2,048 H800 as DeepSeek trained it (arXiv:2412.19437
// §3.2-3.3: PP16 with DualPipe, EP64 across 8 nodes, ZeRO-1 data parallelism, FP8 GEMMs, FP8 dispatch and BF16
// combine), estimated once with --precision bf16 and once with fp8. Every term must move as the format implies:
// the weights gain the fp8 copies, the activations and the dispatch shrink to 1 + 1/32 bytes per element, the
// block GEMMs run at the fp8 peak (twice bf16's on H800) and pay the quantising kernels as memory-bound work.
#include <gtest/gtest.h>

#include "piper/cost/estimate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::cost {
namespace {

struct Pair {
  CostModel bf16, fp8;
};

Result<CostModel> deepseek_h800(Precision p) {
  PIPER_ASSIGN_OR_RETURN(ModelSpec m, load_model("deepseek-v3"));
  PIPER_ASSIGN_OR_RETURN(ClusterSpec c, load_cluster("h800", 256));  // 2,048 GPUs
  TrainSpec t;
  t.seq_len = 4096;
  t.global_batch = 15360;  // DeepSeek-V3's batch (§4.2)
  t.micro_batch_size = 1;
  t.apply_precision(p);
  return CostModel::create(m, c, t);
}

constexpr const char* kStrategy = "dp=128,pp=16,ep=64,zero=1,mbs=1,microbatches=120,schedule=dualpipev";

TEST(PrecisionTermsTest, DeepSeekV3On2048H800) {
  auto bf16 = deepseek_h800(Precision::kBF16);
  auto fp8 = deepseek_h800(Precision::kFP8);
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  ASSERT_TRUE(fp8.ok()) << fp8.status().message();
  auto s = Strategy::parse(kStrategy);
  ASSERT_TRUE(s.ok()) << s.status().message();
  auto eb = bf16->estimate(*s);
  auto ef = fp8->estimate(*s);
  ASSERT_TRUE(eb.ok()) << eb.status().message();
  ASSERT_TRUE(ef.ok()) << ef.status().message();

  // Weights: bf16 compute copy (2 B/param, unsharded under ZeRO-1) + fp8 row-wise and column-wise copies with
  // their scales (2 x 1.03125 B/param).
  const MemoryBreakdown& mb = eb->ranks[0];
  const MemoryBreakdown& mf = ef->ranks[0];
  EXPECT_NEAR(mf.params / mb.params, (2 + 2.0625) / 2, 1e-9);
  EXPECT_DOUBLE_EQ(mf.grads, mb.grads);  // fp32 gradients either way
  EXPECT_DOUBLE_EQ(mf.optimizer, mb.optimizer);
  // Activations: everything stored at the activation width shrinks to 1.03125 / 2; the fp32 router logits,
  // routing weights and token ids do not, so the ratio lies just above 0.516.
  const double act_ratio = mf.activations / mb.activations;
  EXPECT_GT(act_ratio, 1.03125 / 2);
  EXPECT_LT(act_ratio, 0.56);
  std::printf("weights %.2f -> %.2f GB, activations %.2f -> %.2f GB (x%.3f)\n", mb.params / 1e9, mf.params / 1e9,
              mb.activations / 1e9, mf.activations / 1e9, act_ratio);

  // Dispatch bytes per token: 7168 x 2 in bf16, 7168 x 1.03125 in fp8; the combine stays bf16.
  EXPECT_DOUBLE_EQ(bf16->dispatch_bytes_per_token(), 7168 * 2.0);
  EXPECT_DOUBLE_EQ(fp8->dispatch_bytes_per_token(), 7168 * 1.03125);
  EXPECT_DOUBLE_EQ(fp8->combine_bytes_per_token(), 7168 * 2.0);
  // One MoE layer's four all-to-alls over the EP group (64 ranks = 8 nodes): the dispatch at fp8, the rest bf16.
  // (The exposed EP time of the step may grow: DualPipeV hides the all-to-alls behind less compute.)
  const Network& net = bf16->network();
  const GroupLayout ep = net.layout(64, 1);
  const double pairs_per_rank = 4096.0 * 8;
  auto layer_a2a = [&](const CostModel& cm) {
    return net.all_to_all_flat_s(pairs_per_rank * cm.dispatch_bytes_per_token(), ep) +
           3 * net.all_to_all_flat_s(pairs_per_rank * cm.combine_bytes_per_token(), ep);
  };
  EXPECT_NEAR(layer_a2a(*fp8) / layer_a2a(*bf16), (1.03125 / 2 + 3) / 4, 0.01);

  // GEMM time: the experts' forward GEMM runs at the fp8 peak with the same efficiency curve.
  const PartShape shape_b = bf16->part_shape(*s, Calibration{});
  const PartShape shape_f = fp8->part_shape(*s, Calibration{});
  const PartCost cb = part_cost(bf16->parts(), Part::kExperts, shape_b);
  const PartCost cf = part_cost(fp8->parts(), Part::kExperts, shape_f);
  EXPECT_DOUBLE_EQ(cb.f.flops, cf.f.flops);
  const double gemm_b = bf16->device_for(Part::kExperts).time_s(cb.f.flops, 0, cb.f.gemm_dim);
  const double gemm_f = fp8->device_for(Part::kExperts).time_s(cf.f.flops, 0, cf.f.gemm_dim);
  EXPECT_NEAR(gemm_f / gemm_b, 989.0 / 1979.0, 1e-12);
  // The attention core, router and head stay at the bf16 peak.
  EXPECT_DOUBLE_EQ(fp8->device_for(Part::kAttentionCore).peak_flops(), 989e12);
  EXPECT_DOUBLE_EQ(fp8->device_for(Part::kHead).peak_flops(), 989e12);
  // Quantising kernels: per expert pair the block input h and the inner activation f_e are quantised forward
  // (read 2, write 1.03125), the output gradients backward (read 2, write both copies).
  const double pairs = 4096.0 * 8;  // tokens x top_k, tp = 1, balanced
  EXPECT_NEAR(cf.f.pointwise_bytes - cb.f.pointwise_bytes, pairs * (7168 + 2048) * 3.03125, 1.0);
  EXPECT_NEAR(cf.b.pointwise_bytes - cb.b.pointwise_bytes, pairs * (7168 + 2048) * 4.0625, 1.0);

  // The step: less compute and less exposed all-to-all.
  EXPECT_LT(ef->time.compute_s, 0.8 * eb->time.compute_s);
  EXPECT_LT(ef->step_time_s, eb->step_time_s);
  std::printf("step %.2f s (bf16) -> %.2f s (fp8); compute %.2f -> %.2f s, ep %.2f -> %.2f s\n", eb->step_time_s,
              ef->step_time_s, eb->time.compute_s, ef->time.compute_s, eb->comm.ep_s, ef->comm.ep_s);
}

TEST(PrecisionTermsTest, MxFp8QuantisesBothCopiesForward) {
  double f = 0, b = 0;
  quantize_bytes_per_element(Precision::kMXFP8, &f, &b);
  EXPECT_DOUBLE_EQ(f, 2 + 2 * 1.03125);
  EXPECT_DOUBLE_EQ(b, 2 + 2 * 1.03125);
  quantize_bytes_per_element(Precision::kBF16, &f, &b);
  EXPECT_DOUBLE_EQ(f, 0);
  EXPECT_DOUBLE_EQ(b, 0);
}

TEST(PrecisionTermsTest, DeviceWithoutFp8IsRefused) {
  auto m = load_model("deepseek-v3");
  auto c = load_cluster("dgx-a100", 1);
  ASSERT_TRUE(m.ok() && c.ok());
  TrainSpec t;
  t.global_batch = 8;
  t.apply_precision(Precision::kFP8);
  auto cm = CostModel::create(*m, *c, t);
  ASSERT_FALSE(cm.ok());
  EXPECT_NE(cm.status().message().find("has no fp8 peak"), std::string::npos) << cm.status().message();
}

}  // namespace
}  // namespace piper::cost
