// run_training: the training loop of runtime/training_run.h against the same steps run by hand: the same losses
// to the bit, the callback once per step, checkpoints exactly at the save points, the timed-step arithmetic, and
// bad options refused.
#include "piper/runtime/training_run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "piper/runtime/checkpoint/checkpoint.h"
#include "reference_step.h"

namespace piper::runtime::testing {
namespace {
namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name);

TrainOptions tiny_options() {
  static const std::string tokens = write_pattern_token_file(fresh_dir("tokens.u16"));
  TrainOptions o;
  o.data = tokens;
  o.model = small_moe_spec(true);
  o.global_batch = 4;
  o.seq_len = 16;
  o.seed = 21;
  o.optimizer.lr = 3e-3;
  o.strategy = "schedule=1f1b,microbatches=2,mbs=2";
  return o;
}

// A path under this process's scratch directory, with nothing at it.
std::string fresh_dir(const std::string& name) {
  const fs::path root = fs::temp_directory_path() / ("piper_training_run_test_" + std::to_string(::getpid()));
  fs::create_directories(root);
  fs::remove_all(root / name);
  return (root / name).string();
}

TEST(TrainingRunTest, SameLossesAsStepsRunByHandAndOneCallbackPerStep) {
  auto by_hand = Trainer::create(tiny_options()).value();
  std::vector<double> expected;
  for (int i = 0; i < 4; ++i) expected.push_back(by_hand->step().value().loss);

  auto trainer = Trainer::create(tiny_options()).value();
  RunOptions run;
  run.steps = 4;
  std::vector<int64_t> seen;
  run.on_step = [&](const TrainStepStats& s) { seen.push_back(s.step); };
  auto r = run_training(*trainer, run);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->steps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r->steps[i].loss, expected[i]) << "step " << i;
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(r->loss_first, expected.front());
  EXPECT_EQ(r->loss_last, expected.back());
  // The first step is not timed: three timed steps, whose seconds are the run's minus the first step's.
  EXPECT_EQ(r->timed_steps, 3);
  EXPECT_NEAR(r->timed_seconds, r->seconds - r->steps[0].seconds, 1e-12);
  EXPECT_NEAR(r->mine.step_time_s, r->timed_seconds / 3, 1e-15);
  EXPECT_GT(r->tokens_per_s, 0);
  EXPECT_EQ(r->mine.peak_bytes, trainer->memory().peak_total_bytes);
  ASSERT_EQ(r->measured.size(), 1u);  // one rank: its own measurement
  EXPECT_EQ(r->measured[0].step_time_s, r->mine.step_time_s);
  EXPECT_TRUE(r->timelines.empty());  // no trace asked
}

TEST(TrainingRunTest, CheckpointsAtEverySavePointAndTheLastStep) {
  auto trainer = Trainer::create(tiny_options()).value();
  RunOptions run;
  run.steps = 5;
  run.save_dir = fresh_dir("every2");
  run.save_every = 2;
  // The callback runs after the step's checkpoint: ROOT/latest then names the newest one written so far.
  std::vector<std::string> latest;
  run.on_step = [&](const TrainStepStats&) {
    std::ifstream in(fs::path(run.save_dir) / "latest");
    std::string name;
    in >> name;
    latest.push_back(name);
  };
  ASSERT_TRUE(run_training(*trainer, run).ok());
  const std::string none;
  EXPECT_EQ(latest, (std::vector<std::string>{none, checkpoint_step_name(2), checkpoint_step_name(2),
                                              checkpoint_step_name(4), checkpoint_step_name(5)}));
}

TEST(TrainingRunTest, TraceRecordsThisRanksTimelineAndDetachesTheRecorder) {
  auto trainer = Trainer::create(tiny_options()).value();
  RunOptions run;
  run.steps = 2;
  run.trace = true;
  auto r = run_training(*trainer, run);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->timelines.size(), 1u);
  EXPECT_FALSE(r->timelines[0].spans.empty());
  // The recorder is gone; a step after the run must not touch it (ASan would report a use after free).
  EXPECT_TRUE(trainer->step().ok());
}

TEST(TrainingRunTest, ComputeSecondsLeaveOutTheExchangesRunAsTasks) {
  const std::map<std::string, double> t = {{"attention.F", 1.0},  {"experts.BW", 2.0}, {"update", 0.5},
                                           {"a2a.dispatch.F", 4}, {"a2a.combine.B", 8}, {"m2n.F", 16}};
  EXPECT_DOUBLE_EQ(compute_seconds(t), 3.5);
  EXPECT_DOUBLE_EQ(compute_seconds({}), 0);
}

TEST(TrainingRunTest, RefusesZeroStepsAndNegativeSaveEvery) {
  auto trainer = Trainer::create(tiny_options()).value();
  RunOptions run;
  run.steps = 0;
  auto zero = run_training(*trainer, run);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("steps must be >= 1"), std::string::npos);
  run.steps = 1;
  run.save_every = -1;
  EXPECT_FALSE(run_training(*trainer, run).ok());
  EXPECT_EQ(trainer->steps_done(), 0);  // refused before any step
}

}  // namespace
}  // namespace piper::runtime::testing
