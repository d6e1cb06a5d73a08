// `piper bench comm`: all-to-all and MoE dispatch bandwidth of MPI_Alltoallv, flat pairwise and HALO, plus
// alpha-beta calibration. Outside an MPI job it re-executes itself under mpirun with --ranks ranks.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "piper/base/files.h"
#include "piper/base/json.h"
#include "piper/base/strings.h"
#include "piper/cli/cmd_bench.h"
#include "piper/cli/flags.h"
#include "piper/comm/comm_bench.h"
#include "piper/comm/launch.h"
#include "piper/comm/mpi/mpi_communicator.h"
#include "piper/runtime/exec/process_memory.h"

namespace piper::cli {
namespace {

constexpr int64_t kMaxBytesPerPair = int64_t{1} << 30;

struct BenchCommFlags {
  int ranks = 8;
  int ranks_per_node = 0;  // 0 = ranks / 2 (two emulated nodes)
  int lanes = 0;           // 0 = ranks per node (one NIC per rank, the rail layout of DGX H100/H800 nodes)
  std::string sizes = "4KiB,64KiB,256KiB,1MiB";
  std::string halo_direct = "64KiB";
  int iterations = 10;
  int64_t tokens = 512;
  int64_t token_bytes = 4096;
  int experts = 16;
  int top_k = 4;
  bool json = false;
  bool no_calibrate = false;
  bool interleave = true;
  std::string calibration_out;
  std::string mpirun_args;
};

Result<size_t> parse_size(const std::string& text) {
  std::string t = trim(text);
  double scale = 1;
  for (auto [suffix, factor] : {std::pair{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"B", 1.0}}) {
    if (ends_with(t, suffix)) {
      scale = factor;
      t = t.substr(0, t.size() - std::string(suffix).size());
      break;
    }
  }
  auto value = parse_int(t, "--sizes entry");
  if (!value.ok() || *value < 1) {
    return invalid_argument("--sizes: '" + elide(text) + "' is not a positive size; use e.g. 4096, 64KiB, 1MiB");
  }
  const double bytes = static_cast<double>(*value) * scale;
  if (bytes > static_cast<double>(kMaxBytesPerPair)) {
    return invalid_argument("--sizes: '" + elide(text) + "' is more than 1GiB per pair (every rank holds a buffer " +
                            "per peer); use at most 1GiB");
  }
  return static_cast<size_t>(bytes);
}

Status run_bench(const BenchCommFlags& f) {
  comm::CommBenchOptions options;
  options.lanes = f.lanes;
  options.iterations = f.iterations;
  options.tokens_per_rank = f.tokens;
  options.token_bytes = static_cast<size_t>(f.token_bytes);
  options.num_experts = f.experts;
  options.top_k = f.top_k;
  options.calibrate = !f.no_calibrate;
  options.interleave = f.interleave;
  if (trim(f.halo_direct) == "0") {
    options.halo_direct_pair_bytes = 0;
  } else {
    auto direct = parse_size(f.halo_direct);
    if (!direct.ok()) {
      return invalid_argument("--halo-direct: '" + elide(f.halo_direct) + "' is not a size; use 0 (batch every block) " +
                              "or e.g. 64KiB");
    }
    options.halo_direct_pair_bytes = *direct;
  }
  options.bytes_per_pair.clear();
  for (const std::string& s : split(f.sizes, ',')) {
    PIPER_ASSIGN_OR_RETURN(size_t bytes, parse_size(s));
    options.bytes_per_pair.push_back(bytes);
  }
  if (f.token_bytes < 4 || f.token_bytes % 4 != 0) {
    return invalid_argument("--token-bytes must be a positive multiple of 4 (the MoE combine moves float rows), got " +
                            std::to_string(f.token_bytes));
  }

  if (!comm::launched_by_mpi()) {
    PIPER_ASSIGN_OR_RETURN(auto argv, comm::self_argv());
    comm::MpirunOptions launch;
    launch.ranks = f.ranks;
    if (!f.mpirun_args.empty()) {
      for (const std::string& a : split(f.mpirun_args, ' ')) {
        if (!a.empty()) launch.extra_args.push_back(a);
      }
    }
    return comm::exec_under_mpirun(launch, argv);
  }

  runtime::keep_freed_memory();  // as a training rank's allocator keeps its memory (runtime/exec/process_memory.h)
  PIPER_RETURN_IF_ERROR(comm::mpi_init(nullptr, nullptr));
  Status status = [&]() -> Status {
    comm::MpiOptions mpi_options;
    mpi_options.track_arrivals = false;  // time the raw MPI collective
    PIPER_ASSIGN_OR_RETURN(auto world, comm::mpi_world(mpi_options));
    options.ranks_per_node = f.ranks_per_node > 0 ? f.ranks_per_node : std::max(1, world->size() / 2);
    if (f.lanes == 0) options.lanes = options.ranks_per_node;
    PIPER_ASSIGN_OR_RETURN(comm::CommBenchReport report, comm::run_comm_bench(*world, options));
    if (world->rank() != 0) return ok_status();
    if (!f.calibration_out.empty()) {
      PIPER_RETURN_IF_ERROR(write_text_file(f.calibration_out, comm::calibration_json(report).dump(2) + "\n"));
    }
    if (f.json) {
      print_json(comm::to_json(report).dump(2));
    } else {
      std::fputs(comm::to_text(report).c_str(), stdout);
      std::fflush(stdout);
    }
    return ok_status();
  }();
  Status finalized = comm::mpi_finalize();
  PIPER_RETURN_IF_ERROR(status);
  return finalized;
}

PIPER_REGISTER_BENCH(
    g_bench_comm, "comm",
    "All-to-all, MoE dispatch and combine: MPI_Alltoallv vs pairwise vs HALO; alpha-beta calibration",
    [](CLI::App* sub) {
      auto f = std::make_shared<BenchCommFlags>();
      add_int_option(sub, "--ranks", &f->ranks, {1, kMaxLocalRanks, "MPI ranks started on this machine"},
                     "ranks to launch when not already under mpirun")
          ->capture_default_str();
      add_int_option(sub, "--ranks-per-node", &f->ranks_per_node, {1, kMaxLocalRanks, "ranks per emulated node"},
                     "ranks per (emulated) node for HALO; default ranks / 2");
      add_int_option(sub, "--lanes", &f->lanes, {0, kMaxLocalRanks, "NICs per node; 0 = one per rank"},
                      "HALO lanes per node (NICs); 1 = one proxy per node pair, 0 = one per rank (a NIC "
                      "per GPU, as DGX H100/H800 rails)")
          ->capture_default_str();
      sub->add_option("--halo-direct", f->halo_direct,
                      "HALO all-to-all: blocks between nodes of at least this size go directly, "
                      "not through the proxies (0: batch all)")
          ->capture_default_str();
      sub->add_option("--sizes", f->sizes, "bytes per pair, comma separated (4096, 64KiB, 1MiB)")
          ->capture_default_str();
      add_int_option(sub, "--iterations", &f->iterations, {1, 1000000, "timed iterations"},
                     "timed iterations per point")
          ->capture_default_str();
      sub->add_flag("--interleave,!--no-interleave", f->interleave,
                    "run the candidates of a row (MPI, pairwise, HALO) interleaved, one call of each per "
                    "iteration (default); --no-interleave times each in a block of iterations")
          ->capture_default_str();
      add_int_option(sub, "--tokens", &f->tokens, {0, 1 << 20, "tokens per rank; 0 skips the MoE rows"},
                     "MoE dispatch: tokens per rank (0 skips)")
          ->capture_default_str();
      add_int_option(sub, "--token-bytes", &f->token_bytes, {4, 1 << 20, "bytes per token, a multiple of 4"},
                     "MoE dispatch/combine: bytes per token (multiple of 4)")
          ->capture_default_str();
      add_int_option(sub, "--experts", &f->experts, {1, 4096, "experts"}, "MoE dispatch: experts")
          ->capture_default_str();
      add_int_option(sub, "--top-k", &f->top_k, {1, 64, "experts per token"}, "MoE dispatch: experts per token")
          ->capture_default_str();
      sub->add_option("--calibration-out", f->calibration_out,
                      "write the measured alpha-beta figures to this JSON file");
      sub->add_flag("--no-calibrate", f->no_calibrate, "skip the ping-pong calibration");
      sub->add_option("--mpirun-args", f->mpirun_args,
                      "extra mpirun arguments when launching (e.g. \"--hostfile h.txt\")");
      sub->add_flag("--json", f->json, "print one JSON object");
      return std::function<Status()>([f] { return run_bench(*f); });
    });

}  // namespace
}  // namespace piper::cli
