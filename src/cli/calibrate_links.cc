#include "piper/cli/calibrate_links.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <thread>

#include "piper/base/files.h"
#include "piper/cli/calibration_file.h"
#include "piper/cli/command.h"
#include "piper/comm/launch.h"
#include "piper/comm/link_calibration.h"
#include "piper/comm/mpi/mpi_communicator.h"

namespace piper::cli {
namespace {

std::string utc_time() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

Status measure_and_write(const LinkStageOptions& o) {
  comm::MpiOptions mpi;  // the runtime's options: arrival notes on, so each call costs what a training step pays
  PIPER_ASSIGN_OR_RETURN(auto world, comm::mpi_world(mpi));
  comm::LinkCalibrationOptions options;
  options.cores = std::max(1u, std::thread::hardware_concurrency());
  PIPER_ASSIGN_OR_RETURN(comm::LinkCalibration c, comm::measure_links(*world, options));
  if (world->rank() != 0) return ok_status();
  const OrderedJson file = comm::link_calibration_json(
      c, "piper calibrate --ranks " + std::to_string(c.ranks) + " on " + host_name() + " at " + utc_time() +
             ": the runtime's MPI communicator, " + std::to_string(c.ranks_per_node) + " ranks per node");
  PIPER_ASSIGN_OR_RETURN(const std::string out, link_output_path(o.out));
  if (!out.empty()) PIPER_RETURN_IF_ERROR(write_file_atomic(out, file.dump(2) + "\n"));
  if (o.json) {  // spawned: the launching command prints the file in its own JSON
    if (!o.spawned) print_json(OrderedJson{{"links", file}, {"links_out", out}}.dump(2));
    return ok_status();
  }
  std::fputs(comm::to_text(c).c_str(), stdout);
  if (!o.spawned) {
    std::printf("written   %s\n",
                out.empty() ? "nowhere (PIPER_CALIBRATION=none); pass --links-out FILE" : out.c_str());
  }
  std::fflush(stdout);
  return ok_status();
}

}  // namespace

Result<std::string> link_output_path(const std::string& out) {
  if (!out.empty()) return out;
  const std::string path = default_link_calibration_path();
  if (path.empty()) return std::string();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) {
    return failed_precondition("cannot create the folder of the default link calibration file " + path + ": " +
                               ec.message() +
                               "; pass --links-out FILE, or set PIPER_COMM_CALIBRATION to a writable path");
  }
  return path;
}

Status run_link_stage(const LinkStageOptions& o) {
  PIPER_RETURN_IF_ERROR(comm::mpi_init(nullptr, nullptr));
  Status status = measure_and_write(o);
  Status finalized = comm::mpi_finalize();
  PIPER_RETURN_IF_ERROR(status);
  return finalized;
}

Result<std::string> launch_link_stage(const LinkStageOptions& o, Json* written) {
  PIPER_ASSIGN_OR_RETURN(const std::string out, link_output_path(o.out));
  PIPER_ASSIGN_OR_RETURN(std::vector<std::string> argv, comm::self_argv());
  argv.push_back("--links-stage");
  if (!out.empty() && o.out.empty()) argv.insert(argv.end(), {"--links-out", out});
  comm::MpirunOptions launch;
  launch.ranks = o.ranks;
  std::fflush(stdout);
  PIPER_RETURN_IF_ERROR(comm::run_under_mpirun(launch, argv));
  if (!out.empty() && written != nullptr) {
    PIPER_ASSIGN_OR_RETURN(*written, load_json_file(out));
  }
  return out;
}

}  // namespace piper::cli
