// `piper calibrate --ranks`: the link calibration through the binary. Labelled mpi (tests/planner/CMakeLists.txt):
// the command launches its ranks under mpirun, so it runs where the MPI tests run, and under CI's ASan job with
// the MPI tests' settings (scripts/ci-sanitizers.sh), whose leak suppressions need OpenMPI's frames unwound.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "calibrate_cli.h"
#include "piper/base/json.h"

namespace piper::cli {
namespace {

// `piper calibrate --ranks 2` launches two ranks under mpirun and writes a link calibration that the model loads.
TEST(CalibrateCliTest, RanksMeasureTheLinks) {
  const auto dir = std::filesystem::temp_directory_path() / ("piper_links_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string links = (dir / "links.json").string(), device = (dir / "device.json").string();
  std::string text;
  const int rc = run_calibrate("", "--ranks 2 --out " + device + " --links-out " + links, &text);
  if (rc != 0 && too_noisy(text)) GTEST_SKIP() << "too loaded to fit the GEMM curve: " << text;
  ASSERT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("all-to-all of 512.0 KiB after"), std::string::npos) << text;
  EXPECT_NE(text.find("all-reduce of 4.0 KiB while "), std::string::npos) << text;  // the cores computing
  EXPECT_NE(text.find("links     " + links + " (use it with --comm-calibration)"), std::string::npos) << text;
  auto file = load_json_file(links);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  for (const char* key : {"contended_all_reduce", "contended_all_to_all"}) {
    const Json& m = (*file)["measured"][key];
    ASSERT_TRUE(m.is_object()) << key;
    EXPECT_GT(m["computing_s"].get<double>(), 0) << key;
    EXPECT_GE(m["compute_threads"].get<int>(), 1) << key;
    EXPECT_NEAR(m["excess_s"].get<double>(), std::max(0.0, m["computing_s"].get<double>() - m["idle_s"].get<double>()),
                1e-12)
        << key;
    // The calls' own CPU (their thread's polls and MPI's work): some for every call, at most the call's wall time
    // on every core of the machine.
    EXPECT_GT(m["comm_cpu_s"].get<double>(), 0) << key;
    EXPECT_LT(m["comm_cpu_s"].get<double>(), m["computing_s"].get<double>() * std::thread::hardware_concurrency())
        << key;
    // The CPU taken from the compute is the median of its windows' (comm::LinkCalibrationOptions::contended_windows).
    std::vector<double> windows;
    for (const Json& v : m["cpu_s_windows"]) windows.push_back(v.get<double>());
    ASSERT_EQ(windows.size(), 5u) << key;
    std::sort(windows.begin(), windows.end());
    EXPECT_GE(windows.front(), 0) << key;
    EXPECT_EQ(m["cpu_s"].get<double>(), windows[2]) << key;
  }
  ASSERT_EQ(run_piper("env PIPER_CALIBRATION=none",
                      "estimate --model tiny-moe --nodes 1 --json --strategy dp=2 --cluster local-cpu "
                      "--comm-calibration " +
                          links,
                      &text),
            0)
      << text;
  EXPECT_NE(text.find(links + " (--comm-calibration; synchronisation +"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace piper::cli
