// Where a command's device calibration comes from (docs/calibration.md, "Where the file lives").
//
// A calibration measured by `piper calibrate` describes the machine it ran on, so it is found without a flag only
// for that machine: when the cluster is `local-cpu` (piper train, plan --local-ranks, and estimate/simulate/plan
// with --cluster local-cpu). For any other cluster a file is used only when --calibration names it.
//
// The default file, in order:
//   PIPER_CALIBRATION=FILE   that file (it must exist: the user asked for it);
//   PIPER_CALIBRATION=none   no default file (the test suite sets this, so a developer's own calibration never
//                            changes a test's numbers);
//   otherwise                $XDG_CONFIG_HOME/piper/calibration/<hostname>.json, or ~/.config/piper/... when
//                            XDG_CONFIG_HOME is unset; used when it exists (per host, so a home directory shared
//                            between machines keeps one file per machine).
#pragma once

#include <string>

#include "piper/base/status.h"
#include "piper/cost/device_model.h"
#include "piper/spec/cluster_spec.h"
#include "piper/spec/model_spec.h"

namespace piper::cli {

struct DeviceCalibration {
  cost::Calibration calibration;  // the defaults when no file applies
  std::string path;               // the file read; empty: preset figures
  std::string source;             // for the reports: "FILE (--calibration)", "FILE (default ...)", "preset figures ..."
};

// This machine's host name as a file name ('/' and '\\' replaced; "localhost" when it cannot be read).
std::string host_name();

// The default file's path for this machine, or "" under PIPER_CALIBRATION=none (or with neither HOME nor
// XDG_CONFIG_HOME set). `explicit_env` says whether PIPER_CALIBRATION named it.
std::string default_calibration_path(bool* explicit_env = nullptr);

// --calibration FLAG (empty: not given) for a command on `cluster_name`; see the rules above.
Result<DeviceCalibration> load_device_calibration(const std::string& flag, const std::string& cluster_name);

// One core's measured figures in *c (peak_flops_fp32, memory_bw_bytes_per_s) made a rank's on rank_cores cores:
// the thread_figures entry for that many threads (its peak, curve half-dimension and bandwidth) when the file has
// one and rank_cores is whole, else rank_cores x one core's. Returns whether a measured entry was used.
bool scale_to_rank_cores(cost::Calibration* c, double rank_cores);

// `source` with the task profile's note for `model` at `seq` (cost/task_profile.h task_profile_note) after a
// comma, when the calibration has task profiles; `source` alone otherwise.
std::string with_task_profile(const std::string& source, const cost::Calibration& c, const ModelSpec& model,
                              int64_t seq);

// The link calibration (spec/comm_calibration.h: measured alpha-beta of point-to-point messages and collectives,
// written by `piper calibrate --ranks R`, or by `piper bench comm --calibration-out F`), found like the device's:
//   --comm-calibration none       no file: the cluster's preset link figures (kNoLinkCalibration);
//   --comm-calibration FILE       that file, on any cluster;
//   PIPER_COMM_CALIBRATION=FILE   that file (it must exist); =none: no default file;
//   PIPER_CALIBRATION=none        no default file either (one switch turns off both, as the test suite needs);
//   otherwise, on local-cpu only  $XDG_CONFIG_HOME/piper/calibration/<hostname>.links.json (~/.config/... without
//                                 XDG_CONFIG_HOME) when it exists, beside the device file.
std::string default_link_calibration_path(bool* explicit_env = nullptr);

// The --comm-calibration value (and `comm_calibration` argument) that reads no link calibration file at all: what
// a price that needs no links takes (`piper calibrate --model` prices one rank's tasks), whatever this machine's
// default file or PIPER_COMM_CALIBRATION say.
inline constexpr const char* kNoLinkCalibration = "none";

// Applies the link calibration that the rules above pick for a command on `cluster` (its name decides whether the
// default file applies) and returns what the reports print on their `links` line: "FILE (--comm-calibration)",
// "FILE (this machine's default link calibration)", "FILE (PIPER_COMM_CALIBRATION)" or "preset figures (...)".
// Errors: a file that is missing (when named) or does not apply, naming it and the way out.
Result<std::string> apply_link_calibration(const std::string& flag, ClusterSpec* cluster);

// The name of the cluster preset whose calibration lives at the default location.
inline constexpr const char* kThisMachineCluster = "local-cpu";

}  // namespace piper::cli
