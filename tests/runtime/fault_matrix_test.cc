// Faults at chosen points (label mpi, end to end through `piper train --ranks 4`; docs/reliability.md "Faults").
// Each row arms PIPER_FAULT=POINT:RANK:STEP:ACTION in a 6-step run that saves every 2 steps, so that rank RANK
// kills (SIGKILL) or stops (SIGSTOP) itself inside a pipeline send, an EP all-to-all, a HALO exchange, an expert
// migration or a checkpoint write. The row then checks that
// - the job exits non-zero within a bound (a stopped rank is found by the heartbeat, not the 60 s timeout set
//   here), and the launcher's summary names the faulty rank;
// - no process of the job is left (a stopped rank included);
// - `--resume` from the newest complete checkpoint gives the uninterrupted run's remaining losses bit for bit.
// Every row prints one line of the fault matrix ("| point | ..."). The rows marked ci run by default; with
// PIPER_FAULT_MATRIX=full every row runs (scripts/fault-matrix.sh prints the table).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "piper/base/json.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kRanks = 4, kSteps = 6, kSaveEvery = 2;
constexpr double kStopBoundS = 15;  // heartbeat threshold (4 s) + detection + teardown, on a loaded machine
constexpr double kKillBoundS = 15;
const std::string kTrain = "train --model tiny-moe --seq 16 --seed 1234 --warmup 2 --ranks 4 ";

struct Row {
  const char* point;
  const char* strategy;  // a name for the table
  const char* flags;     // --strategy and friends
  int rank;
  int step;  // 0: the first migrating step >= 3 of the uninterrupted run
  const char* action;
  bool ci;
};

// CTest lists the rows by name with this, not as bytes.
void PrintTo(const Row& row, std::ostream* os) {
  *os << row.point << " on " << row.strategy << ", " << row.action << " rank " << row.rank;
}

const char* const kDp2Pp2 = "--strategy dp=2,pp=2,schedule=1f1b,microbatches=4,mbs=1";
const char* const kPp4 = "--strategy pp=4,schedule=1f1b,microbatches=4,mbs=1";
const char* const kEp4 = "--strategy dp=4,ep=4,a2a=flat,microbatches=2,mbs=1";
const char* const kPp2Ep2 = "--strategy dp=2,pp=2,ep=2,a2a=flat,microbatches=2,mbs=1";
const char* const kEp4Halo = "--strategy dp=4,ep=4,a2a=halo,microbatches=2,mbs=1 --ranks-per-node 2";
const char* const kPp2Ep2Halo = "--strategy dp=2,pp=2,ep=2,a2a=halo,microbatches=2,mbs=1 --ranks-per-node 1";
const char* const kEp4Migrate =
    "--strategy dp=4,ep=4,a2a=flat,microbatches=2,mbs=1 --router-skew 0.3 --migrate --migrate-window 1 "
    "--migrate-horizon 100";
const char* const kDp4Ep2Migrate =
    "--strategy dp=4,ep=2,a2a=flat,microbatches=2,mbs=1 --router-skew 0.3 --migrate --migrate-window 1 "
    "--migrate-horizon 100";

const Row kRows[] = {
    {"pp_send", "dp=2 pp=2", kDp2Pp2, 1, 5, "kill", true},
    {"pp_send", "dp=2 pp=2", kDp2Pp2, 1, 5, "stop", false},
    {"pp_send", "pp=4", kPp4, 2, 5, "kill", false},
    {"pp_send", "pp=4", kPp4, 2, 5, "stop", false},
    {"ep_a2a", "dp=4 ep=4", kEp4, 1, 5, "stop", true},
    {"ep_a2a", "dp=4 ep=4", kEp4, 1, 5, "kill", false},
    {"ep_a2a", "dp=2 pp=2 ep=2", kPp2Ep2, 3, 5, "kill", false},
    {"ep_a2a", "dp=2 pp=2 ep=2", kPp2Ep2, 3, 5, "stop", false},
    {"halo", "dp=4 ep=4 halo, 2 nodes", kEp4Halo, 1, 5, "kill", true},
    {"halo", "dp=4 ep=4 halo, 2 nodes", kEp4Halo, 1, 5, "stop", false},
    {"halo", "dp=2 pp=2 ep=2 halo, 4 nodes", kPp2Ep2Halo, 2, 5, "kill", false},
    {"halo", "dp=2 pp=2 ep=2 halo, 4 nodes", kPp2Ep2Halo, 2, 5, "stop", false},
    {"migrate", "dp=4 ep=4 --migrate", kEp4Migrate, 1, 0, "stop", true},
    {"migrate", "dp=4 ep=4 --migrate", kEp4Migrate, 1, 0, "kill", false},
    {"migrate", "dp=4 ep=2 --migrate", kDp4Ep2Migrate, 2, 0, "kill", false},
    {"migrate", "dp=4 ep=2 --migrate", kDp4Ep2Migrate, 2, 0, "stop", false},
    {"ckpt_write", "dp=2 pp=2", kDp2Pp2, 1, 4, "kill", true},
    {"ckpt_write", "dp=2 pp=2", kDp2Pp2, 1, 4, "stop", false},
    {"ckpt_write", "dp=4 ep=4", kEp4, 3, 4, "kill", false},
    {"ckpt_write", "dp=4 ep=4", kEp4, 3, 4, "stop", false},
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void set_env() {
  for (const char* kv : {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_btl=self,vader",
                         "OMPI_MCA_rmaps_base_oversubscribe=1", "OMPI_MCA_mpi_yield_when_idle=1",
                         "OPENBLAS_NUM_THREADS=1"}) {
    std::string s(kv);
    const size_t eq = s.find('=');
    setenv(s.substr(0, eq).c_str(), s.substr(eq + 1).c_str(), 0);
  }
  // Far above the heartbeat's threshold: a stopped rank must be found by the heartbeat.
  setenv("PIPER_COMM_TIMEOUT_S", "60", 1);
  unsetenv("PIPER_FAULT");
  unsetenv("PIPER_HEARTBEAT_S");
}

// Runs piper to completion; stdout only.
std::string run(const std::string& args, int* rc) {
  FILE* f = popen((std::string(PIPER_BIN_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  *rc = pclose(f);
  return out;
}

struct Steps {
  std::vector<double> losses;
  std::vector<int> migrated;
};

Steps steps_of(const std::string& json) {
  Steps s;
  const piper::Json j = piper::Json::parse(json);
  for (const auto& st : j["steps"]) {
    s.losses.push_back(st["loss"].get<double>());
    s.migrated.push_back(st.value("migrated_experts", 0));
  }
  return s;
}

// The pids of the processes whose environment holds `tag`.
std::vector<pid_t> tagged(const std::string& tag) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = read_all("/proc/" + name + "/environ");
    for (size_t at = 0; at < env.size();) {
      size_t end = env.find('\0', at);
      if (end == std::string::npos) end = env.size();
      if (env.compare(at, end - at, tag) == 0) {
        out.push_back(static_cast<pid_t>(std::stol(name)));
        break;
      }
      at = end + 1;
    }
  }
  return out;
}

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '|') c = ' ';
  }
  return s.size() > 160 ? s.substr(0, 160) + "..." : s;
}

class FaultMatrix : public ::testing::TestWithParam<Row> {};

TEST_P(FaultMatrix, SurvivorsStopNamingTheRankAndResumeIsBitwise) {
  const Row& row = GetParam();
  const char* full = std::getenv("PIPER_FAULT_MATRIX");
  if (!row.ci && (full == nullptr || std::string(full) != "full")) GTEST_SKIP() << "PIPER_FAULT_MATRIX=full runs it";
  set_env();
  int rc = 0;
  const std::string straight = run(kTrain + row.flags + " --json --steps " + std::to_string(kSteps), &rc);
  ASSERT_EQ(rc, 0) << straight;
  const Steps expected = steps_of(straight);
  ASSERT_EQ(expected.losses.size(), static_cast<size_t>(kSteps));
  int step = row.step;
  for (int s = 3; step == 0 && s <= kSteps; ++s) {
    if (expected.migrated[static_cast<size_t>(s - 1)] > 0) step = s;
  }
  ASSERT_GT(step, 0) << "no migration in steps 3.." << kSteps << " of the uninterrupted run:\n" << straight;

  // The faulted run.
  const std::string root = (fs::temp_directory_path() / ("piper_fault_" + std::to_string(::getpid()))).string();
  const std::string log = root + ".log", tag = "PIPER_FAULT_TEST_TAG=" + std::to_string(::getpid());
  fs::remove_all(root);
  const std::string fault = std::string(row.point) + ":" + std::to_string(row.rank) + ":" + std::to_string(step) +
                            ":" + row.action;
  const std::string cmd = tag + " PIPER_FAULT=" + fault + " " + PIPER_BIN_PATH + " " + kTrain + row.flags +
                          " --steps " + std::to_string(kSteps) + " --save-every " + std::to_string(kSaveEvery) +
                          " --save " + root + " > " + log + " 2>&1";
  const auto start = Clock::now();
  const pid_t job = fork();
  ASSERT_GE(job, 0);
  if (job == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  Clock::time_point fired{};
  bool has_fired = false;
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(job, &status, WNOHANG)) == 0 && since(start) < 180) {
    if (!has_fired && read_all(log).find("piper: fault injection") != std::string::npos) {
      fired = Clock::now();
      has_fired = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double exit_s = has_fired ? since(fired) : -1;
  if (done == 0) kill(job, SIGKILL);
  const std::string out = read_all(log);
  // No process of the job may outlive it (a stopped rank included); what is left is reported, then killed.
  std::vector<pid_t> left;
  for (int i = 0; i < 200 && !(left = tagged(tag)).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  for (pid_t p : left) kill(p, SIGKILL);
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job outlived it:\n" << out;
  ASSERT_EQ(done, job) << "the job did not stop within 180 s:\n" << out;
  ASSERT_TRUE(has_fired) << "the fault " << fault << " never fired:\n" << out;
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  const bool stop = std::string(row.action) == "stop";
  EXPECT_LT(exit_s, stop ? kStopBoundS : kKillBoundS) << out;
  const std::string rank = "rank " + std::to_string(row.rank);
  const size_t summary_at = out.rfind("piper: error: the 4-rank job failed");
  ASSERT_NE(summary_at, std::string::npos) << "no summary line:\n" << out;
  const std::string summary = out.substr(summary_at, out.find('\n', summary_at) - summary_at);
  const std::string blamed = stop ? rank + " stopped responding" : rank + " was killed by signal 9";
  EXPECT_NE(summary.find(blamed), std::string::npos) << summary;

  // Resume from the newest complete checkpoint: the uninterrupted run's remaining losses, bit for bit.
  const std::string latest = read_all(root + "/latest");
  ASSERT_EQ(latest.rfind("step-", 0), 0u) << "no checkpoint was committed:\n" << out;
  const int from = std::stoi(latest.substr(5));
  const int last_good = std::string(row.point) == "ckpt_write" ? step - kSaveEvery : step - 1;
  EXPECT_EQ(from, last_good / kSaveEvery * kSaveEvery) << "resuming from " << latest;
  const std::string rest = std::to_string(kSteps - from);
  const std::string resumed = run(kTrain + row.flags + " --json --steps " + rest + " --resume " + root, &rc);
  ASSERT_EQ(rc, 0) << resumed;
  const Steps got = steps_of(resumed);
  ASSERT_EQ(got.losses.size(), static_cast<size_t>(kSteps - from));
  int equal = 0;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], expected.losses[static_cast<size_t>(from) + i]) << "step " << from + i + 1;
    equal += got.losses[i] == expected.losses[static_cast<size_t>(from) + i];
  }
  // Every survivor of a stopped rank names it (its heartbeat logs the verdict, its error repeats it); survivors of a
  // killed rank are stopped by mpirun about a second later, before any verdict, and the launcher names the rank.
  int named_by = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (r == row.rank) continue;
    const std::string heard = "[E rank " + std::to_string(r) + " ", want = "comm: no heartbeat from " + rank + " for ";
    for (size_t at = out.find(heard); at != std::string::npos; at = out.find(heard, at + 1)) {
      const size_t close = out.find("] ", at);
      if (close != std::string::npos && out.compare(close + 2, want.size(), want) == 0) {
        ++named_by;
        break;
      }
    }
  }
  if (stop) {
    EXPECT_EQ(named_by, kRanks - 1) << out;
  }
  // The table's cells: what the launcher blamed, and which survivors printed their own error first.
  const size_t blamed_at = summary.find(blamed);
  const std::string named =
      blamed_at == std::string::npos ? "-" : summary.substr(blamed_at, summary.find(';', blamed_at) - blamed_at);
  const size_t by_at = summary.find(" reported errors");
  const size_t ranks_at = summary.rfind("; rank", by_at);
  const std::string reporters = by_at == std::string::npos || ranks_at == std::string::npos
                                    ? "none (mpirun stopped them first)"
                                    : summary.substr(ranks_at + 2, by_at - ranks_at - 2);
  std::printf("| %s | %s | %s | %d@%d | %.2f | %s | %d/%d | %s | step-%d | %d/%zu bitwise |\n", row.point,
              row.strategy, row.action, row.rank, step, exit_s, one_line(named).c_str(), named_by, kRanks - 1,
              reporters.c_str(), from, equal, got.losses.size());
  std::fflush(stdout);
  fs::remove_all(root);
  fs::remove(log);
}

std::string row_name(const ::testing::TestParamInfo<Row>& info) {
  std::string s = std::string(info.param.point) + "_" + info.param.strategy + "_" + info.param.action;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Rows, FaultMatrix, ::testing::ValuesIn(kRows), row_name);

}  // namespace
