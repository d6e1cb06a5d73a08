// Starting a multi-rank job from a single command: `piper bench comm --ranks 8` re-executes itself under
// mpirun when it is not already running under an MPI launcher. Pure C++ (no MPI headers).
#pragma once

#include <string>
#include <vector>

#include "piper/base/status.h"

namespace piper::comm {

// True when this process was started by mpirun/mpiexec/srun (OpenMPI, PMI or PMIx variables are set).
bool launched_by_mpi();

// Set (to 1) in the environment of the mpirun that run_under_mpirun starts, which its local ranks inherit (not by
// `mpirun -x`: OpenMPI refuses -x together with mca_base_env_list, which the sanitizer job sets). A launcher process
// waits for those ranks and reports the job's one outcome, so a rank's error goes to stderr only (the launcher's
// summary quotes it), never as a second `--json` error object on the shared stdout.
inline constexpr const char* kLauncherReportsEnv = "PIPER_LAUNCHER_REPORTS";
bool launcher_reports();

struct MpirunOptions {
  int ranks = 1;
  // Extra mpirun arguments (e.g. "--hostfile", "h.txt"); the defaults below come first.
  std::vector<std::string> extra_args;
};

// The argv that runs `program_argv` under mpirun with `ranks` ranks on this machine: --oversubscribe,
// --bind-to none and mpi_yield_when_idle so more ranks than cores still make progress (docs/comm.md), and
// --allow-run-as-root when running as root. The launcher is $PIPER_MPIRUN or "mpirun".
std::vector<std::string> mpirun_command(const MpirunOptions& options, const std::vector<std::string>& program_argv);

// Replaces this process with mpirun running `program_argv` (execvp). Returns only on failure.
Status exec_under_mpirun(const MpirunOptions& options, const std::vector<std::string>& program_argv);

// Runs `program_argv` under mpirun as a child and waits for it. mpirun's stdout is this process's; its stderr is
// passed through line by line and kept, so that when the job fails the caller gets one line saying which rank
// died or stopped and what the other ranks reported (summarize_job_failure). SIGINT and SIGTERM received
// meanwhile are passed on to mpirun. OK when mpirun exits 0; else that summary, as InvalidArgument when mpirun
// exits 2 (the ranks refused their input) and Unavailable otherwise.
Status run_under_mpirun(const MpirunOptions& options, const std::vector<std::string>& program_argv);

// The one-line summary of a failed job from its stderr lines: the rank mpirun saw die ("process rank 1 ...
// exited on signal 9"), the rank the others named as stopped ("rank 1 stopped responding"), a fault injected on
// purpose (PIPER_FAULT), and which ranks reported errors, with the first such error (elided). Pure.
std::string summarize_job_failure(const std::vector<std::string>& stderr_lines, int ranks, int exit_code);

// Absolute path of the running executable (/proc/self/exe).
Result<std::string> self_executable();

// This process's command line (/proc/self/cmdline) with argv[0] made absolute: what a launcher runs again on
// every rank.
Result<std::vector<std::string>> self_argv();

}  // namespace piper::comm
