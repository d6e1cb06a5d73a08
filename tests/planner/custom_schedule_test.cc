// A schedule registered in C++ is searched by the planner like a built-in one: kept on gpipe's closed form (the
// memory bound: every microbatch in flight) and ranked by the simulator with its own order.
#include <gtest/gtest.h>

#include "../strategy/reversed_gpipe.h"

#include "piper/planner/search.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "piper/strategy/schedules/schedule.h"

namespace piper::planner {
namespace {


TEST(CustomScheduleSearchTest, ARegisteredScheduleIsSearchedAndSimulated) {
  piper::testing::register_reversed_gpipe();
  TrainSpec train;
  train.global_batch = 16;
  train.seq_len = 128;
  SearchOptions o;
  o.space.schedules = {"test-reversed-gpipe"};
  o.top_k = 3;
  o.simulate_top = 3;
  o.local_search_steps = 0;
  o.threads = 1;
  auto r = search(load_model("tiny-moe").value(), load_cluster("dgx-h100", 1).value(), train, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_FALSE(r->top.empty());
  EXPECT_GT(r->stats.scored, 0);
  for (const Plan& p : r->top) {
    EXPECT_EQ(p.strategy.schedule, "test-reversed-gpipe");
    EXPECT_TRUE(p.simulated) << p.strategy.to_string() << ": " << p.sim_error;
    EXPECT_GT(p.sim_step_time_s, 0);
  }
}

}  // namespace
}  // namespace piper::planner
