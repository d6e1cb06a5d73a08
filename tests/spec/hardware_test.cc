// The Blackwell and MI300-class presets, the scale-up domain level and the training precision (issue 32).
#include <gtest/gtest.h>

#include "piper/spec/cluster_loader.h"
#include "piper/spec/train_json.h"
#include "piper/spec/train_spec.h"

namespace piper {
namespace {

struct PresetRow {
  const char* name;
  int devices_per_node, nodes_per_domain;
  double bf16, fp8, memory_bytes, memory_bw, intra_bw, nic_bw_per_device;
};

// Every number against its preset's source (configs/clusters/*.json "source"; docs/cluster_schema.md).
const PresetRow kRows[] = {
    {"b200", 8, 1, 2250e12, 4500e12, 180e9, 8e12, 720e9, 50e9},
    {"h200", 8, 1, 989e12, 1979e12, 141e9, 4.8e12, 370e9, 50e9},
    {"gb200-nvl72", 4, 18, 2500e12, 5000e12, 186e9, 8e12, 720e9, 50e9},
    {"gb300-nvl72", 4, 18, 2500e12, 5000e12, 288e9, 8e12, 720e9, 100e9},
    {"mi300x", 8, 1, 1307.4e12, 2614.9e12, 192e9, 5.3e12, 448e9, 50e9},
    {"mi355x", 8, 1, 2516.6e12, 5033.2e12, 288e9, 8e12, 537.6e9, 50e9},
};

TEST(HardwarePresetTest, NumbersMatchTheirSources) {
  for (const PresetRow& row : kRows) {
    auto c = load_cluster(row.name, 2);
    ASSERT_TRUE(c.ok()) << row.name << ": " << c.status().message();
    EXPECT_EQ(c->node.devices_per_node, row.devices_per_node) << row.name;
    EXPECT_EQ(c->scale_up.nodes_per_domain, row.nodes_per_domain) << row.name;
    EXPECT_DOUBLE_EQ(c->device.peak_flops(DType::kBF16), row.bf16) << row.name;
    EXPECT_DOUBLE_EQ(c->device.peak_flops(DType::kFP8), row.fp8) << row.name;
    EXPECT_DOUBLE_EQ(static_cast<double>(c->device.memory_bytes), row.memory_bytes) << row.name;
    EXPECT_DOUBLE_EQ(c->device.memory_bw_bytes_per_s, row.memory_bw) << row.name;
    EXPECT_DOUBLE_EQ(c->node.intra.bw_bytes_per_s, row.intra_bw) << row.name;
    EXPECT_DOUBLE_EQ(c->node.nic_bw_total() / c->node.devices_per_node, row.nic_bw_per_device) << row.name;
    EXPECT_NEAR(c->device.peak_flops(DType::kFP8) / c->device.peak_flops(DType::kBF16), 2.0, 2e-3) << row.name;
  }
}

TEST(ScaleUpDomainTest, Nvl72DomainsSpanEighteenTrays) {
  auto c = load_cluster("gb200-nvl72", 64);  // 256 GB200
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->world_size(), 256);
  EXPECT_EQ(c->devices_per_domain(), 72);
  EXPECT_EQ(c->num_domains(), 4);  // 18 + 18 + 18 + 10 trays
  EXPECT_TRUE(c->has_multi_node_domain());
  c->scale_up.job_nodes_per_domain = 16;  // Slurm --segment 16: 64 ranks of each rack
  ASSERT_TRUE(c->validate().ok());
  EXPECT_EQ(c->devices_per_domain(), 64);
  EXPECT_EQ(c->num_domains(), 4);
  c->scale_up.job_nodes_per_domain = 19;
  Status s = c->validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--domain-nodes 19 is out of range; allowed 1..18"), std::string::npos) << s.message();
}

TEST(ScaleUpDomainTest, NodesAreTheirOwnDomainWithoutTheKey) {
  auto c = load_cluster("dgx-h100", 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->devices_per_domain(), 8);
  EXPECT_EQ(c->num_domains(), 4);
  EXPECT_FALSE(c->has_multi_node_domain());
}

TEST(ScaleUpDomainTest, BadDomainsAreRefusedWithTheField) {
  auto c = load_cluster("gb200-nvl72", 1);
  ASSERT_TRUE(c.ok());
  Json j = Json::parse(to_json(*c).dump());
  j["scale_up"]["nodes_per_domain"] = 0;
  auto bad = cluster_from_json(j, 1, "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cluster.scale_up.nodes_per_domain"), std::string::npos)
      << bad.status().message();
  j["scale_up"]["nodes_per_domain"] = 18;
  j["scale_up"]["speed"] = 1;
  bad = cluster_from_json(j, 1, "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("speed"), std::string::npos) << bad.status().message();
  // A per-pair matrix describes one node's direct links; a multi-node domain needs a switch.
  auto frontier = load_cluster("frontier", 1);
  ASSERT_TRUE(frontier.ok());
  frontier->scale_up.nodes_per_domain = 2;
  Status s = frontier->validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pair_bw_bytes_per_s"), std::string::npos) << s.message();
}

TEST(PrecisionTest, RecipesSetTheirDtypes) {
  TrainSpec t;
  EXPECT_EQ(t.precision, Precision::kBF16);
  EXPECT_EQ(t.gemm_dtype(), DType::kBF16);
  EXPECT_DOUBLE_EQ(t.activation_bytes(), 2);
  EXPECT_DOUBLE_EQ(t.comm_bytes(), 2);
  EXPECT_DOUBLE_EQ(t.dispatch_bytes(), 2);
  EXPECT_DOUBLE_EQ(t.fp8_weight_copy_bytes(), 0);
  for (Precision p : {Precision::kFP8, Precision::kMXFP8}) {
    t.apply_precision(p);
    EXPECT_EQ(t.gemm_dtype(), DType::kFP8);
    EXPECT_DOUBLE_EQ(t.activation_bytes(), 1.03125);  // 1 byte + one scale byte per 32 (MX) or fp32 per 128
    EXPECT_DOUBLE_EQ(t.dispatch_bytes(), 1.03125);
    EXPECT_DOUBLE_EQ(t.comm_bytes(), 2);  // DeepSeek-V3 combines in bf16
    EXPECT_DOUBLE_EQ(t.fp8_weight_copy_bytes(), 2.0625);
    EXPECT_EQ(t.param_dtype, DType::kBF16);
    EXPECT_EQ(t.grad_dtype, DType::kFP32);
  }
  t.apply_precision(Precision::kBF16);
  EXPECT_EQ(t.activation_dtype, DType::kBF16);
  EXPECT_FALSE(t.dispatch_dtype.has_value());
}

TEST(PrecisionTest, ParsingNamesTheValidChoices) {
  auto p = parse_precision("fp4", "--precision");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "--precision: 'fp4' is not a training precision; pick one of {bf16, fp8, mxfp8}");
  TrainSpec t;
  t.global_batch = 8;
  t.param_dtype = DType::kFP8;
  EXPECT_NE(t.validate().message().find("train.param_dtype: fp8"), std::string::npos);
  t.param_dtype = DType::kBF16;
  t.grad_dtype = DType::kFP8;
  EXPECT_NE(t.validate().message().find("train.grad_dtype: fp8 is out of range"), std::string::npos);
  t.grad_dtype = DType::kFP32;
  t.apply_precision(Precision::kMXFP8);
  t.param_dtype = DType::kFP32;
  t.master_dtype = DType::kFP32;
  EXPECT_NE(t.validate().message().find("param_dtype fp32"), std::string::npos) << t.validate().message();
}

TEST(PrecisionTest, TrainJsonKeysOverrideTheRecipe) {
  auto t = train_from_json(
      Json::parse(
          R"({"global_batch": 8, "precision": "mxfp8", "activation_dtype": "bf16", "optimizer_dtype": "bf16"})"),
      "t");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->precision, Precision::kMXFP8);
  EXPECT_EQ(t->activation_dtype, DType::kBF16);
  EXPECT_EQ(t->optimizer_dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(t->dispatch_bytes(), 1.03125);
  auto again = train_from_json(Json::parse(to_json(*t).dump()), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(to_json(*again).dump(), to_json(*t).dump());
  auto bad = train_from_json(Json::parse(R"({"global_batch": 8, "precision": "int4"})"), "t");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("precision"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace piper
