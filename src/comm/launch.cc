#include "piper/comm/launch.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace piper::comm {

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
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

Result<std::string> self_executable() {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return internal_error(std::string("readlink(/proc/self/exe) failed: ") + std::strerror(errno));
  return std::string(path, n);
}

}  // namespace piper::comm
