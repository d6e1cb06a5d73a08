#include "piper/comm/launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>

#include "piper/base/json.h"
#include "piper/base/strings.h"

namespace piper::comm {

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

bool launcher_reports() {
  const char* v = std::getenv(kLauncherReportsEnv);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::vector<std::string> mpirun_command(const MpirunOptions& options, const std::vector<std::string>& program_argv) {
  const char* launcher = std::getenv("PIPER_MPIRUN");
  std::vector<std::string> cmd = {launcher != nullptr && *launcher ? launcher : "mpirun"};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  for (const char* arg : {"--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"}) {
    cmd.push_back(arg);
  }
  cmd.insert(cmd.end(), options.extra_args.begin(), options.extra_args.end());
  cmd.push_back("-np");
  cmd.push_back(std::to_string(options.ranks));
  cmd.insert(cmd.end(), program_argv.begin(), program_argv.end());
  return cmd;
}

Status exec_under_mpirun(const MpirunOptions& options, const std::vector<std::string>& program_argv) {
  if (options.ranks < 1) return invalid_argument("--ranks must be >= 1, got " + std::to_string(options.ranks));
  std::vector<std::string> cmd = mpirun_command(options, program_argv);
  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return unavailable("could not start '" + cmd[0] + "': " + std::strerror(errno) +
                     "; install openmpi-bin or point PIPER_MPIRUN at mpirun");
}

namespace {

volatile sig_atomic_t g_mpirun_pid = 0;

void forward_signal(int sig) {
  if (g_mpirun_pid > 0) kill(static_cast<pid_t>(g_mpirun_pid), sig);
}

std::string elide(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n) + "..."; }

std::string rank_list(const std::set<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

std::string summarize_job_failure(const std::vector<std::string>& lines, int ranks, int exit_code) {
  static const std::regex died(R"(process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+) \(([^)]*)\))");
  static const std::regex reported(R"(^piper: error: rank (\d+): (.*)$)");
  static const std::regex stalled(R"(rank (\d+) stopped responding \(no heartbeat for ([0-9.]+) s)");
  static const std::regex injected(R"(^piper: fault injection: (rank \d+ .*) \(PIPER_FAULT\))");
  std::string dead, stopped, fault, first_error;
  std::set<int> reporters;
  std::smatch m;
  for (const std::string& whole : lines) {
    // std::regex recurses per character: a long line would exhaust the stack, and its head says what counts.
    const std::string line = whole.substr(0, 1000);
    if (dead.empty() && std::regex_search(line, m, died)) {
      dead = "rank " + m[1].str() + " was killed by signal " + m[2].str() + " (" + m[3].str() + ")";
    }
    if (fault.empty() && std::regex_search(line, m, injected)) fault = m[1].str();
    if (std::regex_search(line, m, reported)) {
      reporters.insert(std::stoi(m[1].str()));
      if (first_error.empty()) first_error = "rank " + m[1].str() + ": " + elide(m[2].str(), 300);
      std::smatch s;
      const std::string text = m[2].str();
      if (stopped.empty() && std::regex_search(text, s, stalled)) {
        stopped = "rank " + s[1].str() + " stopped responding (no heartbeat for " + s[2].str() + " s)";
      }
    }
  }
  std::string out = "the " + std::to_string(ranks) + "-rank job failed (mpirun exit status " +
                    std::to_string(exit_code) + ")";
  if (!fault.empty()) out += "; injected fault: " + fault;
  if (!dead.empty()) out += "; " + dead;
  if (!stopped.empty()) out += "; " + stopped;
  if (reporters.empty()) {
    out += "; no rank reported an error before mpirun stopped the job";
  } else {
    out += "; rank" + std::string(reporters.size() > 1 ? "s " : " ") + rank_list(reporters) +
           " reported errors, first " + first_error;
  }
  return out;
}

Status run_under_mpirun(const MpirunOptions& options, const std::vector<std::string>& program_argv) {
  if (options.ranks < 1) return invalid_argument("--ranks must be >= 1, got " + std::to_string(options.ranks));
  std::vector<std::string> cmd = mpirun_command(options, program_argv);
  std::vector<char*> argv;
  for (std::string& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) return internal_error(std::string("pipe() failed: ") + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) return internal_error(std::string("fork() failed: ") + std::strerror(errno));
  if (child == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    setenv(kLauncherReportsEnv, "1", 1);  // inherited by the local ranks (launch.h)
    execvp(argv[0], argv.data());
    std::fprintf(stderr,
                 "piper: error: could not start '%s': %s; install openmpi-bin or point PIPER_MPIRUN at mpirun\n",
                 argv[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  g_mpirun_pid = child;
  struct sigaction forward = {}, old_int = {}, old_term = {};
  forward.sa_handler = forward_signal;
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  std::vector<std::string> lines;
  std::string partial;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    fwrite(buf, 1, static_cast<size_t>(n), stderr);
    partial.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = partial.find('\n')) != std::string::npos; partial.erase(0, nl + 1)) {
      if (lines.size() < 10000) lines.push_back(partial.substr(0, nl));
    }
  }
  if (!partial.empty()) lines.push_back(partial);
  close(fds[0]);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_mpirun_pid = 0;
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 0) return ok_status();
  // Exit status 2 is the ranks' "bad input" (the CLI's convention): keep it for the caller's exit status.
  const std::string summary = summarize_job_failure(lines, options.ranks, code);
  return code == 2 ? invalid_argument(summary) : unavailable(summary);
}

Result<std::string> self_executable() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return internal_error(std::string("readlink(/proc/self/exe) failed: ") + std::strerror(errno));
  return std::string(path, n);
}

Result<std::vector<std::string>> self_argv() {
  PIPER_ASSIGN_OR_RETURN(std::string cmdline, read_text_file("/proc/self/cmdline"));
  std::vector<std::string> args = split(cmdline, '\0');
  while (!args.empty() && args.back().empty()) args.pop_back();
  PIPER_ASSIGN_OR_RETURN(std::string exe, self_executable());
  if (!args.empty()) args[0] = exe;
  return args;
}

}  // namespace piper::comm
