// A rank killed mid-run after a checkpoint (label mpi, end to end through the piper binary): the job stops
// within the communication timeout naming the dead rank, the last checkpoint is intact, and `--resume` continues
// with the uninterrupted run's losses bit for bit (same strategy, same reduction order); a one-rank resume of
// the same checkpoint matches within 1e-5. The same for an expert-parallel run that migrates experts after every
// step: whatever migration the kill interrupts, the last checkpoint holds every expert once with its table.
// A rank killed *during* a save (the moment rank 0 creates ROOT/step-N.tmp, seen through inotify) leaves the
// previous checkpoint as `latest`, and resuming from it gives the uninterrupted run's losses bit for bit.
// Through the CLI: an unwritable --save directory and another model's checkpoint are refused before any step.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "piper/base/json.h"

namespace {
namespace fs = std::filesystem;

constexpr int kTotalSteps = 8;
constexpr double kTimeoutS = 5;  // PIPER_COMM_TIMEOUT_S of the killed run
const std::string kTrain =
    "train --model tiny-moe --seq 16 --seed 1234 --warmup 2 --strategy pp=2,schedule=1f1b,microbatches=4,mbs=1 ";
const std::string kOneRank = "train --model tiny-moe --seq 16 --seed 1234 --warmup 2 --strategy microbatches=4,mbs=1 ";
// Skewed routing, ep=2, a migration plan after every step (moves counted over 100 steps so that they pay).
const std::string kSkew = "--router-skew 0.3 ";
const std::string kTrainEp = "train --model tiny-moe --seq 16 --seed 1234 --warmup 2 " + kSkew +
                             "--strategy dp=2,ep=2,a2a=flat,microbatches=2,mbs=1 --migrate --migrate-window 1 "
                             "--migrate-horizon 100 ";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void set_mpi_env() {
  for (const char* kv :
       {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_btl=self,vader",
        "OMPI_MCA_rmaps_base_oversubscribe=1", "OMPI_MCA_mpi_yield_when_idle=1", "OPENBLAS_NUM_THREADS=1"}) {
    std::string s(kv);
    const size_t eq = s.find('=');
    setenv(s.substr(0, eq).c_str(), s.substr(eq + 1).c_str(), 0);
  }
  setenv("PIPER_COMM_TIMEOUT_S", std::to_string(static_cast<int>(kTimeoutS)).c_str(), 1);
}

// Runs piper to completion; stdout only (`with_stderr`: both).
std::string run(const std::string& args, int* rc, bool with_stderr = false) {
  FILE* f = popen((std::string(PIPER_BIN_PATH) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) out.append(buf.data(), n);
  *rc = pclose(f);
  return out;
}

int migrated_experts(const std::string& json) {
  int n = 0;
  const piper::Json j = piper::Json::parse(json);
  for (const auto& s : j["steps"]) n += s.value("migrated_experts", 0);
  return n;
}

std::vector<double> losses(const std::string& json) {
  std::vector<double> out;
  const piper::Json j = piper::Json::parse(json);
  for (const auto& s : j["steps"]) out.push_back(s["loss"].get<double>());
  return out;
}

// The pid of the MPI rank `rank` whose environment carries `tag`, or -1.
pid_t find_rank(int rank, const std::string& tag) {
  const std::string want_rank = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string env = read_all("/proc/" + name + "/environ");
    bool has_rank = false, has_tag = false;
    for (size_t at = 0; at < env.size();) {
      size_t end = env.find('\0', at);
      if (end == std::string::npos) end = env.size();
      const std::string var = env.substr(at, end - at);
      has_rank |= var == want_rank;
      has_tag |= var == tag;
      at = end + 1;
    }
    if (has_rank && has_tag) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// `train` on 2 ranks: uninterrupted, then killed after a checkpoint and resumed (2 ranks and `one_rank`).
void kill_and_resume(const std::string& train, const std::string& one_rank, bool migrates) {
  set_mpi_env();
  const std::string root = (fs::temp_directory_path() / ("piper_kill_" + std::to_string(::getpid()))).string();
  fs::remove_all(root);
  int rc = 0;
  const std::string straight = run(train + "--ranks 2 --json --steps " + std::to_string(kTotalSteps), &rc);
  ASSERT_EQ(rc, 0) << straight;
  const std::vector<double> expected = losses(straight);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kTotalSteps));
  if (migrates) {
    EXPECT_GT(migrated_experts(straight), 0) << "no expert migrated in the uninterrupted run:\n" << straight;
  }

  // The run to kill: long, with a checkpoint every 2 steps; rank 1 dies by SIGKILL once one exists.
  const std::string tag = "PIPER_KILL_TEST_TAG=" + std::to_string(::getpid());
  const std::string log = root + ".log";
  const std::string cmd = tag + " " + PIPER_BIN_PATH + " " + train + "--ranks 2 --steps 100000 --save-every 2 --save " +
                          root + " > " + log + " 2>&1";
  const pid_t job = fork();
  ASSERT_GE(job, 0);
  if (job == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  pid_t victim = -1;
  while (waited() < 60 && victim < 0) {
    if (fs::exists(root + "/latest")) victim = find_rank(1, tag);
    if (victim < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (victim < 0) kill(job, SIGKILL);
  ASSERT_GT(victim, 0) << "no checkpoint or no rank 1 within 60 s:\n" << read_all(log);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(job, &status, WNOHANG)) == 0 && waited() < 120) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  if (done == 0) kill(job, SIGKILL);
  const std::string out = read_all(log);
  ASSERT_EQ(done, job) << "the job did not stop after rank 1 was killed:\n" << out;
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_LT(stop_s, kTimeoutS + 10) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << "the error does not name rank 1:\n" << out;
  std::printf("rank 1 killed: the job stopped %.2f s later; its last words:\n%s\n", stop_s,
              out.substr(out.size() > 600 ? out.size() - 600 : 0).c_str());

  // The newest complete checkpoint resumes on 2 ranks bit for bit, and on one rank within 1e-5.
  const std::string latest = read_all(root + "/latest");
  ASSERT_EQ(latest.rfind("step-", 0), 0u) << latest;
  const int step = std::stoi(latest.substr(5));
  ASSERT_GE(step, 2);
  ASSERT_LT(step, kTotalSteps) << "rank 1 was killed too late for this test";
  const std::string rest = std::to_string(kTotalSteps - step);
  const std::string resumed = run(train + "--ranks 2 --json --steps " + rest + " --resume " + root, &rc);
  ASSERT_EQ(rc, 0) << resumed;
  const std::vector<double> got = losses(resumed);
  ASSERT_EQ(got.size(), static_cast<size_t>(kTotalSteps - step));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[step + i]) << "step " << step + i + 1;
  const std::string one = run(one_rank + "--ranks 1 --json --steps " + rest + " --resume " + root, &rc);
  ASSERT_EQ(rc, 0) << one;
  const std::vector<double> got1 = losses(one);
  ASSERT_EQ(got1.size(), got.size());
  for (size_t i = 0; i < got1.size(); ++i) {
    EXPECT_LE(std::abs(got1[i] - expected[step + i]) / expected[step + i], 1e-5) << "step " << step + i + 1;
  }
  std::printf("resumed from step %d: %zu steps equal to the uninterrupted run\n", step, got.size());
  fs::remove_all(root);
  fs::remove(log);
}

std::string step_name(int step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08d", step);
  return buf;
}

// Starts `cmd` under sh, its output to `log`; returns the pid.
pid_t start_job(const std::string& cmd, const std::string& log) {
  const std::string line = cmd + " > " + log + " 2>&1";
  const pid_t job = fork();
  if (job == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return job;
}

// Waits up to timeout_s for `job`; true when it ended (its status in *status).
bool wait_job(pid_t job, double timeout_s, int* status) {
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < timeout_s) {
    if (waitpid(job, status, WNOHANG) == job) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(job, SIGKILL);
  waitpid(job, status, 0);
  return false;
}

// One attempt: runs `train` with a checkpoint every 2 steps and SIGKILLs rank 1 the moment a save after the first
// one starts (rank 0 creates ROOT/step-N.tmp). Returns N, or -1 when the save completed before the kill landed
// (then `latest` names step N and the attempt proves nothing).
int kill_during_save(const std::string& train, const std::string& root, double* stop_s, std::string* log_text) {
  fs::remove_all(root);
  fs::create_directories(root);
  const int fd = inotify_init1(IN_NONBLOCK);
  EXPECT_GE(fd, 0);
  EXPECT_GE(inotify_add_watch(fd, root.c_str(), IN_CREATE | IN_MOVED_TO), 0);
  const std::string tag = "PIPER_KILL_TEST_TAG=" + std::to_string(::getpid());
  const std::string log = root + ".log";
  const pid_t job = start_job(
      tag + " " + PIPER_BIN_PATH + " " + train + "--ranks 2 --steps 100000 --save-every 2 --save " + root, log);
  const auto start = std::chrono::steady_clock::now();
  auto waited = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  pid_t victim = -1;
  while (victim < 0 && waited() < 60) {
    victim = find_rank(1, tag);
    if (victim < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  bool committed = false;  // `latest` exists: the next .tmp is a save with a previous checkpoint to keep
  int step = -1;
  alignas(inotify_event) char buf[4096];
  while (victim > 0 && step < 0 && waited() < 120) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(fd, buf, sizeof(buf));
    for (ssize_t at = 0; at < n && step < 0;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
      const std::string name = e->len > 0 ? e->name : "";
      if (name == "latest") committed = true;
      if (committed && (e->mask & IN_CREATE) && (e->mask & IN_ISDIR) && name.size() > 4 &&
          name.compare(name.size() - 4, 4, ".tmp") == 0) {
        kill(victim, SIGKILL);
        step = std::stoi(name.substr(5));
      }
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
    }
  }
  close(fd);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  const bool done = wait_job(job, 120, &status);
  *stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  *log_text = read_all(log);
  fs::remove(log);
  EXPECT_GT(victim, 0) << "no rank 1 within 60 s:\n" << *log_text;
  EXPECT_GE(step, 0) << "no second save within 120 s:\n" << *log_text;
  EXPECT_TRUE(done) << "the job did not stop after rank 1 was killed:\n" << *log_text;
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << *log_text;
  // The kill landed during the save unless the save got as far as renaming its .tmp directory.
  if (step < 0 || !fs::is_directory(root + "/" + step_name(step) + ".tmp")) return -1;
  return step;
}

TEST(KilledRank, DuringSaveLeavesThePreviousCheckpointAndResumeIsBitwise) {
  set_mpi_env();
  const std::string root = (fs::temp_directory_path() / ("piper_kill_save_" + std::to_string(::getpid()))).string();
  int rc = 0;
  const std::vector<double> expected =
      losses(run(kTrain + "--ranks 2 --json --steps " + std::to_string(kTotalSteps), &rc));
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kTotalSteps));
  int interrupted = -1;
  double stop_s = 0;
  std::string log;
  int attempts = 0;
  while (attempts < 3 && interrupted < 0 && !HasFailure()) {
    ++attempts;
    interrupted = kill_during_save(kTrain, root, &stop_s, &log);
  }
  ASSERT_GT(interrupted, 0) << "every kill landed after its save had committed";
  // The interrupted save left only its .tmp directory; `latest` names the checkpoint before it, which is whole.
  const std::string tmp = root + "/" + step_name(interrupted) + ".tmp";
  EXPECT_TRUE(fs::is_directory(tmp));
  const std::string latest = read_all(root + "/latest");
  ASSERT_EQ(latest.rfind("step-", 0), 0u) << latest;
  const int step = std::stoi(latest.substr(5));
  EXPECT_EQ(step, interrupted - 2);
  ASSERT_LT(step, kTotalSteps) << "rank 1 was killed too late for this test";
  EXPECT_LT(stop_s, kTimeoutS + 10) << log;
  EXPECT_NE(log.find("rank 1"), std::string::npos) << "the error does not name rank 1:\n" << log;
  std::printf("rank 1 killed while step %d was being saved (attempt %d): the job stopped %.2f s later\n", interrupted,
              attempts, stop_s);

  // Resuming from it continues bit for bit; its own save removes the stale .tmp and keeps two checkpoints.
  const std::string rest = std::to_string(kTotalSteps - step);
  const std::string resumed =
      run(kTrain + "--ranks 2 --json --steps " + rest + " --resume " + root + " --save " + root, &rc);
  ASSERT_EQ(rc, 0) << resumed;
  const std::vector<double> got = losses(resumed);
  ASSERT_EQ(got.size(), static_cast<size_t>(kTotalSteps - step));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[step + i]) << "step " << step + i + 1;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(read_all(root + "/latest"), step_name(kTotalSteps) + "\n");
  EXPECT_TRUE(fs::is_directory(root + "/" + latest.substr(0, latest.size() - 1)));
  std::printf("resumed from step %d: %zu steps equal to the uninterrupted run\n", step, got.size());
  fs::remove_all(root);
}

// `--save DIR` that cannot be written: refused before the first step, naming DIR and the reason.
TEST(CheckpointCli, UnwritableSaveDirFailsBeforeTheFirstStep) {
  const std::string dir = (fs::temp_directory_path() / ("piper_unwritable_" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  { std::ofstream(dir + "/file") << "x"; }
  int rc = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::string out = run(kOneRank + "--steps 100000 --save " + dir + "/file/ckpt", &rc, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--save " + dir + "/file/ckpt: cannot create the directory"), std::string::npos) << out;
  EXPECT_NE(out.find("Not a directory"), std::string::npos) << out;
  EXPECT_EQ(out.find("step     1"), std::string::npos) << "a step ran before the check:\n" << out;
  EXPECT_LT(seconds, 30) << out;
  fs::remove_all(dir);
}

// A checkpoint of tiny-moe resumed with another architecture: "written for another model", naming the fields.
TEST(CheckpointCli, AnotherModelIsRefusedNamingTheFields) {
  const std::string dir = (fs::temp_directory_path() / ("piper_other_model_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  int rc = 0;
  const std::string saved = run(kOneRank + "--steps 1 --save " + dir + "/ckpt", &rc, true);
  ASSERT_EQ(rc, 0) << saved;
  piper::Json model = piper::Json::parse(read_all(std::string(PIPER_SOURCE_DIR) + "/configs/models/tiny-moe.json"));
  model["name"] = "tiny-moe-2l";
  model["num_layers"] = 2;
  { std::ofstream(dir + "/model.json") << model.dump(1); }
  const std::string other = "train --model " + dir + "/model.json --seq 16 --seed 1234 --warmup 2 ";
  const std::string out = run(other + "--strategy microbatches=4,mbs=1 --steps 1 --resume " + dir + "/ckpt", &rc, true);
  EXPECT_NE(rc, 0) << out;
  for (const std::string part : {"was written for another model: 'tiny-moe'", "this run trains 'tiny-moe-2l'",
                                 "num_layers 4 vs 2", "resume with --model tiny-moe"}) {
    EXPECT_NE(out.find(part), std::string::npos) << part << " in\n" << out;
  }
  fs::remove_all(dir);
}

TEST(KilledRank, JobStopsNamingItAndResumeIsBitwise) { kill_and_resume(kTrain, kOneRank, false); }

TEST(KilledRank, MigratingExpertParallelRunResumesBitwise) { kill_and_resume(kTrainEp, kOneRank + kSkew, true); }

}  // namespace
