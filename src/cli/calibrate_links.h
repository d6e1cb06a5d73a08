// The link stage of `piper calibrate --ranks R` (docs/calibration.md, "Links"): R ranks under mpirun measure
// point-to-point and collective alpha-beta through the runtime's communicator (comm/link_calibration.h) and rank 0
// writes the link calibration file (spec/comm_calibration.h), by default this machine's
// ($XDG_CONFIG_HOME/piper/calibration/<hostname>.links.json, cli/calibration_file.h), which `piper train`,
// `plan --local-ranks` and `estimate`/`simulate`/`plan --cluster local-cpu` then use without a flag.
//
// Outside an MPI job `launch_link_stage` runs this same command under mpirun with R ranks (as `piper bench comm`
// does) and waits; inside one (the child, or a command started by scripts/two-node-emulation.sh) `run_link_stage`
// measures. Under the two-node emulation the ranks' host names tell the nodes apart and the file also gets the
// inter-node figures (node.nic_latency_s, node.nic_bw_bytes_per_s).
#pragma once

#include <string>

#include "piper/base/json.h"
#include "piper/base/status.h"

namespace piper::cli {

struct LinkStageOptions {
  int ranks = 0;    // 0: no link stage
  std::string out;  // --links-out; empty: the default file (created), or nowhere under PIPER_CALIBRATION=none
  bool json = false;
  bool spawned = false;  // started by launch_link_stage: print the measurements only as text
};

// The file the stage writes: `out`, or the default link calibration path with its folder created; "" when
// PIPER_CALIBRATION=none or PIPER_COMM_CALIBRATION=none and no --links-out.
Result<std::string> link_output_path(const std::string& out);

// Inside an MPI job: measure, and on rank 0 write the file and print (text, or JSON unless spawned).
Status run_link_stage(const LinkStageOptions& o);

// Outside one: run this command under mpirun with o.ranks ranks (hidden --links-stage) and wait; returns the file
// written ("" when none) and, when it was written, its content in *written.
Result<std::string> launch_link_stage(const LinkStageOptions& o, Json* written);

}  // namespace piper::cli
