// `piper calibrate --model`'s task profile (src/cli/calibrate_tasks.h): the stage on tiny-moe, the file's
// "task_profiles" schema, and the refusal of an unknown model.
#include "piper/cli/calibrate_tasks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "calibrate_cli.h"
#include "piper/spec/counting.h"
#include "piper/spec/model_loader.h"

namespace piper::cli {
namespace {

// A short run: tiny-moe at seq 32, one thread, mbs 1 (two microbatches of one sequence), priced with the preset's
// figures (an empty device calibration).
Result<std::vector<TaskProfile>> tiny_profile() {
  TaskProfileOptions o;
  o.models = {"tiny-moe"};
  o.seq_len = 32;
  o.threads = {1};
  o.mbs = {1};
  return measure_task_profiles(o, Json::object());
}

// What a 1f1b plan of two microbatches on one rank runs per step, from the model alone: every chunk an F and a
// fused BW per microbatch, and one update per chunk (tiny-moe: 4 layers, the first dense, 8 experts, untied head).
std::map<std::string, int64_t> expected_calls(const ModelSpec& m) {
  const int64_t mb = 2, moe = m.num_moe_layers(), dense = m.num_dense_layers();
  std::map<std::string, int64_t> calls;
  const std::map<std::string, int64_t> chunks = {{"embed", 1},     {"attn", m.num_layers}, {"router", moe},
                                                 {"experts", moe}, {"mlp", dense},         {"head", 1}};
  int64_t updates = 0;
  for (const auto& [part, n] : chunks) {
    calls[part + ".F"] = mb * n;
    calls[part + ".BW"] = mb * n;
    updates += n;
  }
  calls["update"] = updates;
  return calls;
}

TEST(CalibrateTasksTest, EveryTaskOfThePlanMeasuredAndPriced) {
  Result<std::vector<TaskProfile>> got = tiny_profile();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 1u);
  const TaskProfile& p = (*got)[0];
  Result<ModelSpec> model = load_model("tiny-moe");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(p.model, "tiny-moe");
  EXPECT_EQ(p.parameters, count_params(*model).total());
  EXPECT_EQ(p.seq_len, 32);
  std::map<std::string, int64_t> calls;
  for (const TaskPoint& t : p.points) {
    EXPECT_EQ(t.threads, 1);
    EXPECT_EQ(t.tokens, 32) << t.task;
    EXPECT_GT(t.measured_s, 0) << t.task;
    EXPECT_GT(t.priced_s, 0) << t.task;
    EXPECT_TRUE(calls.emplace(t.task, t.calls).second) << "two points of " << t.task;
  }
  EXPECT_EQ(calls, expected_calls(*model));
}

TEST(CalibrateTasksTest, JsonHasTheConsumersFieldsAndRoundTrips) {
  Result<std::vector<TaskProfile>> got = tiny_profile();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  Result<Json> parsed = parse_json(task_profiles_json(*got).dump(2), "task_profiles");
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  ASSERT_TRUE(parsed->is_array());
  ASSERT_EQ(parsed->size(), got->size());
  const TaskProfile& p = (*got)[0];
  const Json& j = (*parsed)[0];
  std::set<std::string> keys;
  for (const auto& [key, value] : j.items()) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"model", "parameters", "seq", "points"}));
  EXPECT_EQ(j["model"].get<std::string>(), p.model);
  ASSERT_TRUE(j["parameters"].is_number_integer());
  EXPECT_EQ(j["parameters"].get<int64_t>(), p.parameters);
  ASSERT_TRUE(j["seq"].is_number_integer());
  EXPECT_EQ(j["seq"].get<int64_t>(), 32);
  ASSERT_EQ(j["points"].size(), p.points.size());
  for (size_t i = 0; i < p.points.size(); ++i) {
    const Json& q = j["points"][i];
    const TaskPoint& t = p.points[i];
    keys.clear();
    for (const auto& [key, value] : q.items()) keys.insert(key);
    EXPECT_EQ(keys, (std::set<std::string>{"threads", "tokens", "task", "calls", "measured_s", "priced_s"}));
    ASSERT_TRUE(q["threads"].is_number_integer() && q["tokens"].is_number_integer() && q["calls"].is_number_integer());
    EXPECT_EQ(q["threads"].get<int>(), t.threads);
    EXPECT_EQ(q["tokens"].get<int64_t>(), t.tokens);
    EXPECT_EQ(q["task"].get<std::string>(), t.task);
    EXPECT_EQ(q["calls"].get<int64_t>(), t.calls);
    EXPECT_DOUBLE_EQ(q["measured_s"].get<double>(), t.measured_s);
    EXPECT_DOUBLE_EQ(q["priced_s"].get<double>(), t.priced_s);
  }
}

TEST(CalibrateTasksTest, UnknownModelIsRefusedBeforeAnyMeasurement) {
  TaskProfileOptions o;
  o.models = {"no-such-model"};
  o.threads = {1};
  Result<std::vector<TaskProfile>> got = measure_task_profiles(o, Json::object());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("--model no-such-model: unknown model preset 'no-such-model'"),
            std::string::npos)
      << got.status().message();
  // The command refuses it at once, before its measurements (which take half a minute), and writes nothing.
  std::string text;
  const std::string out = testing::TempDir() + "calibrate_tasks_unknown.json";
  EXPECT_NE(run_piper("", "calibrate --model no-such-model --out " + out, &text), 0);
  EXPECT_NE(text.find("unknown model preset 'no-such-model'"), std::string::npos) << text;
  EXPECT_EQ(text.find("calibrate: GEMM"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(out));
  // With --ranks too, before the links' mpirun (which the link stage launches first).
  const std::string links_out = testing::TempDir() + "calibrate_tasks_unknown.links.json";
  EXPECT_NE(
      run_piper("", "calibrate --ranks 2 --model no-such-model --out " + out + " --links-out " + links_out, &text), 0);
  EXPECT_NE(text.find("unknown model preset 'no-such-model'"), std::string::npos) << text;
  EXPECT_EQ(text.find("calibrate: links"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(links_out));
}

TEST(CalibrateTasksTest, SeqWithoutModelIsRefused) {
  std::string text;
  const std::string out = testing::TempDir() + "calibrate_tasks_seq.json";
  EXPECT_NE(run_piper("", "calibrate --seq 64 --out " + out, &text), 0);
  EXPECT_NE(text.find("--seq requires --model"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(CalibrateTasksTest, SeqBeyondTheModelIsRefused) {
  TaskProfileOptions o;
  o.models = {"tiny-moe"};
  o.seq_len = 4096;
  Result<std::vector<ModelSpec>> got = load_task_profile_models(o);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("give --seq <= 128"), std::string::npos) << got.status().message();
}

}  // namespace
}  // namespace piper::cli
