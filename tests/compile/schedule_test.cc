#include <gtest/gtest.h>

#include <algorithm>

#include "schedule_test_util.h"

namespace piper::compile {
namespace {

using testing::run_schedule;

TEST(ScheduleTest, OneFOneBMakespanAndBubble) {
  auto r = run_schedule("1f1b", 4, 8, 1);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->timeline.makespan, 33);
  EXPECT_DOUBLE_EQ(r->timeline.bubble_fraction, 9.0 / 33.0);
}

TEST(ScheduleTest, GpipeClosedForm) {
  for (int p : {2, 4, 8}) {
    for (int m : {1, p, 2 * p, 4 * p}) {
      for (UnitCosts c : {UnitCosts{1, 1, 1}, UnitCosts{1, 2, 1}, UnitCosts{0.5, 1, 0.25}}) {
        auto r = run_schedule("gpipe", p, m, 1, c);
        ASSERT_TRUE(r.ok()) << r.status().message();
        double step = c.f + c.b + c.w;
        EXPECT_DOUBLE_EQ(r->timeline.makespan, (m + p - 1) * step) << "p=" << p << " m=" << m;
        EXPECT_NEAR(r->timeline.bubble_fraction, (p - 1.0) / (m + p - 1.0), 1e-12) << "p=" << p << " m=" << m;
      }
    }
  }
}

TEST(ScheduleTest, OneFOneBClosedForm) {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      auto r = run_schedule("1f1b", p, m, 1, {1, 2, 1});
      ASSERT_TRUE(r.ok()) << r.status().message();
      EXPECT_DOUBLE_EQ(r->timeline.makespan, (m + p - 1) * 4.0) << "p=" << p << " m=" << m;
    }
  }
}

// Interleaved with v stages per rank: bubble (p-1)(T_F+T_B)/v with T per full (1F1B-sized) stage, i.e.
// (p-1)(f+b+w) with per-virtual-stage costs; ideal m*v*(f+b+w).
TEST(ScheduleTest, InterleavedClosedForm) {
  for (int p : {2, 4, 8}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 4 * p}) {
        auto r = run_schedule("interleaved", p, m, v, {0.5, 0.5, 0.5});
        ASSERT_TRUE(r.ok()) << r.status().message();
        EXPECT_DOUBLE_EQ(r->timeline.makespan, (m * v + p - 1) * 1.5) << "p=" << p << " v=" << v << " m=" << m;
      }
    }
  }
}

TEST(ScheduleTest, ZbH1HasAThirdOfOneFOneBBubble) {
  auto zb = run_schedule("zb-h1", 4, 8, 1);
  auto base = run_schedule("1f1b", 4, 8, 1);
  ASSERT_TRUE(zb.ok() && base.ok());
  EXPECT_DOUBLE_EQ(zb->timeline.makespan, 27);
  EXPECT_DOUBLE_EQ(zb->timeline.total_idle * 3, base->timeline.total_idle);
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      auto z = run_schedule("zb-h1", p, m, 1);
      auto o = run_schedule("1f1b", p, m, 1);
      ASSERT_TRUE(z.ok() && o.ok());
      double ratio = z->timeline.total_idle / o->timeline.total_idle;
      EXPECT_GT(ratio, 0.2) << "p=" << p << " m=" << m;
      EXPECT_LT(ratio, 0.45) << "p=" << p << " m=" << m;
    }
  }
}

// V and AF schedules run two (or v) half-size stages per rank: halve the costs to compare with 1F1B.
TEST(ScheduleTest, DualPipeVAndAfPipeAreDeadlockFreeWithLessBubble) {
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      auto base = run_schedule("1f1b", p, m, 1);
      ASSERT_TRUE(base.ok()) << base.status().message();
      for (const char* name : {"dualpipev", "af-pipe"}) {
        auto r = run_schedule(name, p, m, 2, {0.5, 0.5, 0.5});
        ASSERT_TRUE(r.ok()) << name << " p=" << p << " m=" << m << ": " << r.status().message();
        EXPECT_DOUBLE_EQ(r->timeline.ranks[0].busy, m * 3.0) << name;
        EXPECT_LT(r->timeline.bubble_fraction, base->timeline.bubble_fraction) << name << " p=" << p << " m=" << m;
      }
    }
  }
}

TEST(ScheduleTest, InflightMatchesFormulas) {
  for (int p : {2, 4, 8}) {
    const int m = 2 * p;
    auto one = run_schedule("1f1b", p, m, 1);
    auto gp = run_schedule("gpipe", p, m, 1);
    auto zb = run_schedule("zb-h1", p, m, 1);
    auto il = run_schedule("interleaved", p, m, 2);
    auto dv = run_schedule("dualpipev", p, m, 2);
    ASSERT_TRUE(one.ok() && gp.ok() && zb.ok() && il.ok() && dv.ok());
    int zb_max = 0;
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(one->timeline.ranks[r].peak_inflight_microbatches, p - r) << "1f1b rank " << r;  // p - r
      EXPECT_EQ(gp->timeline.ranks[r].peak_inflight_microbatches, m) << "gpipe rank " << r;      // m
      zb_max = std::max(zb_max, zb->timeline.ranks[r].peak_inflight_microbatches);
    }
    EXPECT_EQ(zb_max, p);  // ZB-H1: p on the worst rank, as 1F1B
    // Interleaved: (1 + (p-1)/(p v)) x the 1F1B peak of p full stages = v p + p - 1 half-size stages on rank 0.
    EXPECT_EQ(il->timeline.ranks[0].peak_inflight_microbatches, 2 * p + p - 1);
    // DualPipeV: PP + 1 stage units with PP = 2p stages.
    EXPECT_EQ(dv->timeline.ranks[0].peak_inflight_microbatches, 2 * p + 1);
  }
}

// ep_overlap (Megatron's combined 1F1B): one more warm-up forward, then every steady step is one may-overlap slot
// holding a forward and a backward of different microbatches (so neither waits for the other), m v - warm-up of
// them per rank; one more microbatch in flight than without.
TEST(ScheduleTest, EpOverlapPairsIndependentForwardAndBackward) {
  struct Case {
    const char* name;
    int p, m, v;
  };
  for (const Case& c : {Case{"1f1b", 1, 4, 1}, Case{"1f1b", 2, 4, 1}, Case{"1f1b", 4, 8, 1},
                        Case{"interleaved", 2, 4, 2}, Case{"interleaved", 4, 8, 2}, Case{"interleaved", 2, 8, 3}}) {
    SCOPED_TRACE(std::string(c.name) + " p=" + std::to_string(c.p) + " m=" + std::to_string(c.m));
    auto base = run_schedule(c.name, c.p, c.m, c.v);
    auto r = run_schedule(c.name, c.p, c.m, c.v, {}, true);
    ASSERT_TRUE(base.ok() && r.ok()) << (r.ok() ? base.status().message() : r.status().message());
    for (int rank = 0; rank < c.p; ++rank) {
      const auto& slots = r->schedule.ranks[static_cast<size_t>(rank)].slots;
      int pairs = 0, leading_forwards = 0;
      bool seen_backward = false;
      for (const auto& slot : slots) {
        if (slot.actions.size() == 2) {
          ++pairs;
          EXPECT_EQ(slot.actions[0].pass, ir::Pass::kF);
          EXPECT_EQ(slot.actions[1].pass, ir::Pass::kBW);
          const bool same = slot.actions[0].mb == slot.actions[1].mb && slot.actions[0].stage == slot.actions[1].stage;
          EXPECT_FALSE(same) << "rank " << rank << ": " << slot_text(slot, true) << " pairs a microbatch with itself";
        } else {
          ASSERT_EQ(slot.actions.size(), 1u);
        }
        if (slot.actions.back().pass != ir::Pass::kF) seen_backward = true;
        if (!seen_backward) ++leading_forwards;
      }
      // Warm-up: Megatron's count + 1 (1f1b: p - 1 - r + 1; interleaved: 2 (p - 1 - r) + (v - 1) p + 1).
      const int warmup = std::min(c.v == 1 ? c.p - rank : 2 * (c.p - 1 - rank) + (c.v - 1) * c.p + 1, c.m * c.v);
      EXPECT_EQ(leading_forwards, warmup) << "rank " << rank;
      EXPECT_EQ(pairs, c.m * c.v - warmup) << "rank " << rank;
      EXPECT_EQ(r->timeline.ranks[static_cast<size_t>(rank)].peak_inflight_microbatches,
                std::min(base->timeline.ranks[static_cast<size_t>(rank)].peak_inflight_microbatches + 1, c.m * c.v))
          << "rank " << rank;
    }
    EXPECT_DOUBLE_EQ(r->timeline.ranks[0].busy, base->timeline.ranks[0].busy);
  }
  auto bad = run_schedule("gpipe", 2, 4, 1, {}, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ep_overlap pairs the steady forward and backward of 1f1b or interleaved"),
            std::string::npos)
      << bad.status().message();
}

TEST(ScheduleTest, ParameterErrors) {
  auto r = run_schedule("dualpipev", 4, 6, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("microbatches >= 2*pp"), std::string::npos) << r.status().message();
  r = run_schedule("1f1bb", 4, 8, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("did you mean '1f1b'"), std::string::npos) << r.status().message();
  r = run_schedule("af-pipe", 3, 6, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("even pp"), std::string::npos) << r.status().message();
}

TEST(ScheduleTest, DirectiveJsonRoundTripGivesSameActions) {
  schedules::ScheduleParams params{4, 8, 2};
  auto directives = schedules::schedule_directives("dualpipev", params);
  ASSERT_TRUE(directives.ok());
  Json j = ir::directives_to_json(*directives);
  auto back = ir::directives_from_json(Json::parse(j.dump()), "round trip");
  ASSERT_TRUE(back.ok()) << back.status().message();
  auto a = realize_schedule(*directives, 4, 8, 8);
  auto b = realize_schedule(*back, 4, 8, 8);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(format_action_lists(*a), format_action_lists(*b));
}

// A user order that contradicts the dependencies across ranks makes a cycle; the error names the directive.
TEST(ScheduleTest, CyclicUserOrderNamesTheDirective) {
  Json j = Json::parse(R"([
    {"directive": "place", "filter": {"stage": 0}, "rank": 0},
    {"directive": "place", "filter": {"stage": 1}, "rank": 1},
    {"directive": "order", "rank": 0, "slots": ["0F0", "0BW0", "0F1", "0BW1"]},
    {"directive": "order", "rank": 1, "slots": ["1F1", "1BW1", "1F0", "1BW0"]}
  ])");
  auto d = ir::directives_from_json(j, "user.json");
  ASSERT_TRUE(d.ok()) << d.status().message();
  auto s = realize_schedule(*d, 2, 2, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("directive 3 (order)"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("cycle"), std::string::npos) << s.status().message();
}

TEST(ScheduleTest, UnorderedChunkAndMissingStageAreErrors) {
  Json j = Json::parse(R"([
    {"directive": "place", "filter": {"stage": 0}, "rank": 0},
    {"directive": "place", "filter": {"stage": 1}, "rank": 1},
    {"directive": "order", "rank": 0, "slots": ["0F0", "0BW0"]},
    {"directive": "order", "rank": 1, "slots": ["1F0"]}
  ])");
  auto d = ir::directives_from_json(j, "user.json");
  ASSERT_TRUE(d.ok());
  auto s = realize_schedule(*d, 2, 2, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not in any order row"), std::string::npos) << s.status().message();

  Json bad = Json::parse(R"([{"directive": "place", "filter": {"stage": 5}, "rank": 0}])");
  d = ir::directives_from_json(bad, "user.json");
  ASSERT_TRUE(d.ok());
  s = realize_schedule(*d, 2, 2, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("directive 0 (place)"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("does not exist"), std::string::npos) << s.status().message();
}

TEST(ScheduleTest, RenderersAgreeWithTimeline) {
  auto r = run_schedule("zb-h1", 2, 4, 1);
  ASSERT_TRUE(r.ok());
  Json j = schedule_to_json(r->schedule, r->timeline, {});
  EXPECT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][0]["actions"].size(), 12u);
  EXPECT_EQ(j["ranks"][0]["actions"][0], "F0");
  auto text = format_timeline(r->schedule, r->timeline, {});
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("rank1 |. "), std::string::npos) << *text;  // rank 1 idles while F0 runs on rank 0
  std::string svg = schedule_to_svg(r->schedule, r->timeline, {}, "zb-h1");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("#f28e2b"), std::string::npos);  // W rectangles present
}

}  // namespace
}  // namespace piper::compile
