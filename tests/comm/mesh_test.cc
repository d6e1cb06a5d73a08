#include "piper/comm/mesh.h"

#include <gtest/gtest.h>

#include "piper/comm/launch.h"
#include "piper/strategy/strategy.h"

namespace piper::comm {
namespace {

TEST(Mesh, RankCoordinateRoundTripInnermostFirst) {
  auto mesh = Mesh::create({"tp", "ep", "pp"}, {2, 3, 2});
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(mesh->size(), 12);
  // rank = tp + 2 * (ep + 3 * pp)
  EXPECT_EQ(mesh->coords(7), (std::vector<int>{1, 0, 1}));
  for (int r = 0; r < 12; ++r) EXPECT_EQ(mesh->rank_of(mesh->coords(r)), r);
}

TEST(Mesh, GroupsAlongAxes) {
  auto mesh = Mesh::create({"tp", "ep", "pp"}, {2, 3, 2});
  ASSERT_TRUE(mesh.ok());
  EXPECT_EQ(*mesh->group(7, {"ep"}), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(*mesh->group(7, {"tp"}), (std::vector<int>{6, 7}));
  EXPECT_EQ(*mesh->group(7, {"pp"}), (std::vector<int>{1, 7}));
  EXPECT_EQ(*mesh->group(7, {"tp", "ep"}), (std::vector<int>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(mesh->group_name(7, {"ep"}), "ep[tp=1,pp=1]");
}

TEST(Mesh, BadInputNamesTheProblem) {
  EXPECT_FALSE(Mesh::create({"tp", "tp"}, {2, 2}).ok());
  EXPECT_FALSE(Mesh::create({"tp"}, {0}).ok());
  EXPECT_FALSE(Mesh::create({"tp"}, {2, 2}).ok());
  auto mesh = Mesh::create({"tp", "dp"}, {2, 2});
  ASSERT_TRUE(mesh.ok());
  auto bad = mesh->group(0, {"ep"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tp, dp"), std::string::npos) << bad.status().message();
}

TEST(Launch, MpirunCommandOversubscribesAndKeepsProgramArgs) {
  MpirunOptions options;
  options.ranks = 8;
  auto cmd = mpirun_command(options, {"/bin/piper", "bench", "comm"});
  ASSERT_GE(cmd.size(), 6u);
  EXPECT_NE(std::find(cmd.begin(), cmd.end(), "--oversubscribe"), cmd.end());
  EXPECT_NE(std::find(cmd.begin(), cmd.end(), "mpi_yield_when_idle"), cmd.end());
  auto np = std::find(cmd.begin(), cmd.end(), "-np");
  ASSERT_NE(np, cmd.end());
  EXPECT_EQ(*(np + 1), "8");
  EXPECT_EQ(cmd.back(), "comm");
}

}  // namespace
}  // namespace piper::comm
