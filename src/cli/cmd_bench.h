// `piper bench <what>`: a registry of benchmark sub-subcommands. Each lives in its own cmd_bench_<what>.cc and
// registers itself with PIPER_REGISTER_BENCH (same shape as PIPER_REGISTER_COMMAND), so `bench kernels` can be
// added in another file without touching cmd_bench.cc.
#pragma once

#include <vector>

#include "piper/cli/command.h"

namespace piper::cli {

std::vector<Command>& bench_registry();

struct BenchRegistrar {
  explicit BenchRegistrar(Command command) { bench_registry().push_back(std::move(command)); }
};

}  // namespace piper::cli

#define PIPER_REGISTER_BENCH(var, ...) static ::piper::cli::BenchRegistrar var{::piper::cli::Command{__VA_ARGS__}}
