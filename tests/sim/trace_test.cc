// The Chrome trace of a simulated step parses back and holds every rank's process, streams, events and memory.
#include "piper/report/chrome_trace.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "piper/base/check.h"
#include "piper/sim/simulate.h"
#include "piper/spec/cluster_loader.h"
#include "piper/spec/model_loader.h"
#include "test_clusters.h"

namespace piper::report {
namespace {

TEST(ChromeTraceTest, ParsesBackWithEveryRanksEventsAndMemory) {
  auto m = load_model("tiny-moe");
  PIPER_CHECK_OK(m.status());
  ClusterSpec c = sim::testing::make_cluster(1, 4, 100e9, 1, 10e9);
  c.device = load_cluster("dgx-h100", 1).value().device;
  Strategy s = Strategy::parse("dp=2,ep=2,pp=2,zero=1,microbatches=2").value();
  TrainSpec t;
  t.seq_len = 64;
  sim::SimOptions o;
  o.full = true;
  o.record_timeline = true;
  auto r = sim::simulate(*m, c, t, s, {}, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string path = std::string(PIPER_BINARY_DIR) + "/trace_test.json";
  ASSERT_TRUE(write_chrome_trace(path, r->compiled.plan, r->sim).ok());
  auto text = read_text_file(path);
  ASSERT_TRUE(text.ok());
  auto j = parse_json(*text, path);
  ASSERT_TRUE(j.ok()) << j.status().message();
  ASSERT_TRUE(j->contains("traceEvents"));
  std::map<int, std::string> processes;
  std::map<int, std::set<std::string>> threads;
  std::map<int, int> complete, counters;
  std::set<std::string> names;
  for (const Json& e : (*j)["traceEvents"]) {
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    if (ph == "M" && e["name"] == "process_name") processes[pid] = e["args"]["name"];
    if (ph == "M" && e["name"] == "thread_name") threads[pid].insert(e["args"]["name"].get<std::string>());
    if (ph == "X") {
      ++complete[pid];
      EXPECT_GE(e["dur"].get<double>(), 0.0);
      EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), r->step_time_s * 1e6 * (1 + 1e-9));
      names.insert(e["name"].get<std::string>());
    }
    if (ph == "C") {
      ++counters[pid];
      EXPECT_EQ(e["name"], "memory");
    }
  }
  ASSERT_EQ(processes.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    const compile::Program& p = r->compiled.plan.program(rank);
    size_t timed = 0;
    std::set<std::string> streams;
    for (const auto& st : p.streams) {
      streams.insert(st.name);
      for (const auto& in : st.instrs) {
        using compile::OpKind;
        timed += in.op == OpKind::kCompute || in.op == OpKind::kUpdate || in.op == OpKind::kSend ||
                 in.op == OpKind::kRecv || in.op == OpKind::kCollective;
      }
    }
    EXPECT_EQ(threads[rank], streams) << rank;
    EXPECT_EQ(complete[rank], static_cast<int>(timed)) << rank;
    EXPECT_GT(counters[rank], 1) << rank;
  }
  // Events are named by chunk, task and microbatch.
  EXPECT_TRUE(names.count("L0.attn.F.mb0") || names.count("L0.attn.F.mb1")) << *names.begin();
}

}  // namespace
}  // namespace piper::report
