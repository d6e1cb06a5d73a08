// Plan's global rank layout and collective groups (what the runtime and simulator map instructions onto).
#include "piper/compile/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "piper/compile/compile.h"
#include "piper/spec/model_loader.h"
#include "tiny_plan.h"

namespace piper::compile {
namespace {

TEST(PlanTest, GroupsPartitionTheWorld) {
  const Plan plan = compiled("dp=4,ep=2,tp=2,sp=1,pp=2,schedule=1f1b,microbatches=2");
  ASSERT_EQ(plan.world_size, 16);
  const std::map<std::string, size_t> sizes = {{"tp", 2}, {"dp", 4}, {"ep", 2}, {"edp", 4}, {"pp", 2}};
  for (int r = 0; r < plan.world_size; ++r) {
    EXPECT_EQ(plan.rank_of(plan.coords[static_cast<size_t>(r)]), r);
    for (const auto& [axis, size] : sizes) {
      auto g = plan.group_ranks(r, axis);
      ASSERT_TRUE(g.ok());
      EXPECT_EQ(g->size(), size) << axis << " rank " << r;
      EXPECT_TRUE(std::find(g->begin(), g->end(), r) != g->end()) << axis;
      for (int m : *g) EXPECT_EQ(*plan.group_ranks(m, axis), *g) << axis << ": groups must partition the world";
    }
    // An expert group and an expert-data-parallel group meet in exactly one rank.
    auto ep = *plan.group_ranks(r, "ep"), edp = *plan.group_ranks(r, "edp");
    std::vector<int> both;
    std::set_intersection(ep.begin(), ep.end(), edp.begin(), edp.end(), std::back_inserter(both));
    EXPECT_EQ(both, std::vector<int>{r});
    // Point-to-point peers keep the dp and tp coordinates and run the peer's template.
    const RankCoord& c = plan.coords[static_cast<size_t>(r)];
    const int peer = plan.p2p_peer(r, 1 - c.pp);
    EXPECT_EQ(plan.coords[static_cast<size_t>(peer)].dp, c.dp);
    EXPECT_EQ(plan.coords[static_cast<size_t>(peer)].tp, c.tp);
    EXPECT_EQ(plan.rank_template[static_cast<size_t>(peer)], 1 - c.pp);
    EXPECT_EQ(plan.p2p_peer(peer, c.pp), r);
  }
  // Layout: tp innermost, then dp, then pp.
  EXPECT_EQ(*plan.group_ranks(0, "tp"), (std::vector<int>{0, 1}));
  EXPECT_EQ(*plan.group_ranks(0, "dp"), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(*plan.group_ranks(0, "ep"), (std::vector<int>{0, 2}));
  // The experts' replicas: the other ep block's rank and both tp ranks of each (whole experts on every tp rank).
  EXPECT_EQ(*plan.group_ranks(0, "edp"), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(*plan.group_ranks(0, "pp"), (std::vector<int>{0, 8}));
}

TEST(PlanTest, UnknownAxisAndRankAreErrors) {
  const Plan plan = compiled("dp=2,pp=2,schedule=1f1b,microbatches=2");
  auto g = plan.group_ranks(0, "xp");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("'xp'"), std::string::npos) << g.status().message();
  EXPECT_FALSE(plan.group_ranks(4, "dp").ok());
}

}  // namespace
}  // namespace piper::compile
