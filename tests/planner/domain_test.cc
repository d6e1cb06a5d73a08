// EP placement relative to the scale-up domain (issue 32): plan/domain.h and what the planner picks for
// DeepSeek-V3 on 256 GB200 (64 NVL72 trays) with --precision mxfp8.
#include "piper/planner/domain.h"

#include <gtest/gtest.h>

#include "piper/planner/search.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"

namespace piper::planner {
namespace {

Strategy parse(const char* text) {
  auto s = Strategy::parse(text);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return *s;
}

TEST(EpDomainTest, GroupsInsideOrAcrossDomains) {
  auto c = load_cluster("gb200-nvl72", 64);
  ASSERT_TRUE(c.ok()) << c.status().message();
  // 72-rank domains: blocks of 8 tile them, blocks of 64 do not.
  EXPECT_TRUE(ep_inside_domain(parse("dp=64,pp=4,ep=8"), *c));
  EXPECT_FALSE(ep_inside_domain(parse("dp=64,pp=4,ep=64"), *c));
  EXPECT_FALSE(ep_fits_domain(parse("dp=64,pp=4,ep=64"), *c));
  // ep after dp in the mesh order: members dp ranks apart, blocks of 8 x 32 = 256 ranks.
  EXPECT_FALSE(ep_inside_domain(parse("dp=32,pp=8,ep=8,order=tp-dp-ep-pp"), *c));
  EXPECT_TRUE(ep_fits_domain(parse("dp=32,pp=8,ep=8,order=tp-dp-ep-pp"), *c));
  c->scale_up.job_nodes_per_domain = 16;  // 64 ranks of each rack
  EXPECT_TRUE(ep_inside_domain(parse("dp=64,pp=4,ep=64"), *c));
  EXPECT_EQ(ep_stride(parse("dp=64,pp=4,ep=8,tp=1")), 1);
  EXPECT_TRUE(ep_inside_domain(parse("dp=1,pp=256"), *c));  // no EP
}

// The planner keeps EP inside the domain whenever a placement there exists: among its best plans, every one
// whose EP could fit a domain (ep * tp divides the domain's ranks) has it inside.
void expect_plans_keep_ep_in_domain(int domain_nodes, int* inside_with_ep_over_8) {
  auto m = load_model("deepseek-v3");
  auto c = load_cluster("gb200-nvl72", 64);
  ASSERT_TRUE(m.ok() && c.ok());
  c->scale_up.job_nodes_per_domain = domain_nodes;
  TrainSpec t;
  t.seq_len = 4096;
  t.global_batch = 4096;  // Megatron-Bridge's GB200 DeepSeek-V3 rows
  t.apply_precision(Precision::kMXFP8);
  SearchOptions o;
  o.verify = false;
  o.top_k = 8;
  o.threads = 2;
  o.space.mbs = {1};
  o.space.schedules = {"1f1b", "interleaved"};
  o.space.vpp = {4};
  o.space.zero = {1};
  o.space.recompute = {Recompute::kNone, Recompute::kFull};
  o.space.a2a = {"flat"};
  auto r = search(*m, *c, t, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_FALSE(r->top.empty()) << "DeepSeek-V3 fits 256 GB200 under some strategy";
  for (const Plan& p : r->top) {
    std::printf("domain %d nodes: %-90s %.2f s ep %s\n", domain_nodes, p.strategy.to_string().c_str(),
                p.estimate.step_time_s, ep_inside_domain(p.strategy, *c) ? "inside" : "spans");
    if (ep_fits_domain(p.strategy, *c)) {
      EXPECT_TRUE(ep_inside_domain(p.strategy, *c)) << p.strategy.to_string();
    }
    if (p.strategy.ep > 8 && ep_inside_domain(p.strategy, *c)) ++*inside_with_ep_over_8;
  }
}

TEST(EpDomainTest, DeepSeekV3On256Gb200KeepsEpInsideTheDomain) {
  int wide = 0;
  expect_plans_keep_ep_in_domain(18, &wide);  // whole racks: 72-rank domains
  wide = 0;
  expect_plans_keep_ep_in_domain(16, &wide);  // 16-tray segments: 64-rank domains
  EXPECT_GT(wide, 0) << "with 64-rank domains some best plan runs EP wider than a DGX node inside the domain";
}

}  // namespace
}  // namespace piper::planner
