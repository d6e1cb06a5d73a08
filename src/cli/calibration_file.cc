#include "piper/cli/calibration_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "piper/base/files.h"
#include "piper/cost/task_profile.h"
#include "piper/spec/comm_calibration.h"

namespace piper::cli {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h = buf;
  for (char& c : h) {
    if (c == '/' || c == '\\') c = '_';  // a file name, never a path
  }
  return h;
}

namespace {

// $XDG_CONFIG_HOME/piper/calibration (or ~/.config/...); "" with neither set.
std::string calibration_folder() {
  std::string base = env("XDG_CONFIG_HOME");
  if (base.empty()) {
    const std::string home = env("HOME");
    if (home.empty()) return "";
    base = home + "/.config";
  }
  return base + "/piper/calibration";
}

}  // namespace

std::string default_calibration_path(bool* explicit_env) {
  const std::string named = env("PIPER_CALIBRATION");
  if (explicit_env != nullptr) *explicit_env = !named.empty() && named != "none";
  if (named == "none") return "";
  if (!named.empty()) return named;
  const std::string folder = calibration_folder();
  return folder.empty() ? "" : folder + "/" + host_name() + ".json";
}

std::string default_link_calibration_path(bool* explicit_env) {
  const std::string named = env("PIPER_COMM_CALIBRATION");
  if (explicit_env != nullptr) *explicit_env = !named.empty() && named != "none";
  if (named == "none" || (named.empty() && env("PIPER_CALIBRATION") == "none")) return "";
  if (!named.empty()) return named;
  const std::string folder = calibration_folder();
  return folder.empty() ? "" : folder + "/" + host_name() + ".links.json";
}

namespace {

// "; synchronisation +X / +Y per collective" or why the file's figures do not apply.
std::string sync_note(const CommCalibrationInfo& info, const ClusterSpec& cluster) {
  if (!info.sync_measured) return "";
  if (!info.sync_applied) {
    return "; its synchronisation costs, measured with " + std::to_string(info.sync_ranks_per_node) +
           " ranks per node, not applied to " + std::to_string(cluster.node.devices_per_node);
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "; synchronisation +%.3g ms per all-to-all, +%.3g ms per other collective",
                cluster.node.sync_excess_all_to_all_s * 1e3, cluster.node.sync_excess_other_s * 1e3);
  std::string note = buf;
  if (cluster.node.sync_excess_pair_s > 0) {
    std::snprintf(buf, sizeof(buf), ", +%.3g ms per collective of two ranks", cluster.node.sync_excess_pair_s * 1e3);
    note += buf;
  }
  const NodeSpec& n = cluster.node;
  if (n.busy_cpu_all_to_all_s > 0 || n.busy_cpu_other_s > 0 || n.busy_cpu_pair_s > 0 || n.busy_cpu_p2p_s > 0) {
    std::snprintf(buf, sizeof(buf),
                  "; CPU taken from compute %.3g / %.3g / %.3g ms per rank of an all-to-all / other collective / "
                  "collective of two ranks, %.3g ms per point-to-point transfer",
                  n.busy_cpu_all_to_all_s * 1e3, n.busy_cpu_other_s * 1e3, n.busy_cpu_pair_s * 1e3,
                  n.busy_cpu_p2p_s * 1e3);
    note += buf;
  }
  if (n.node_figures) {
    std::snprintf(buf, sizeof(buf),
                  "; inside one node +%.3g / +%.3g ms per all-to-all / other collective, CPU %.3g / %.3g ms per rank",
                  n.sync_excess_node_all_to_all_s * 1e3, n.sync_excess_node_other_s * 1e3,
                  n.busy_cpu_node_all_to_all_s * 1e3, n.busy_cpu_node_other_s * 1e3);
    note += buf;
  }
  if (n.copy_cpu_s_per_byte > 0) {
    std::snprintf(buf, sizeof(buf), "; copies %.3g ns of CPU per byte carried", n.copy_cpu_s_per_byte * 1e9);
    note += buf;
  }
  if (!n.exchange_lag.empty()) {
    std::snprintf(buf, sizeof(buf), "; the last rank to arrive leaves an all-to-all %.3g-%.3g ms after the others",
                  n.exchange_lag.front().second * 1e3, n.exchange_lag.back().second * 1e3);
    note += buf;
  }
  if (n.a2a_wait_cpu_share > 0) {
    std::snprintf(buf, sizeof(buf), "; waiting in one burns %.3g %% of a core", n.a2a_wait_cpu_share * 100);
    note += buf;
  }
  return note;
}

}  // namespace

Result<std::string> apply_link_calibration(const std::string& flag, ClusterSpec* cluster) {
  CommCalibrationInfo info;
  if (flag == kNoLinkCalibration) return std::string("preset figures (--comm-calibration none)");
  if (!flag.empty()) {
    PIPER_RETURN_IF_ERROR(load_comm_calibration(flag, cluster, &info));
    return flag + " (--comm-calibration" + sync_note(info, *cluster) + ")";
  }
  if (cluster->name != kThisMachineCluster) return std::string("preset figures (no --comm-calibration file)");
  bool from_env = false;
  const std::string path = default_link_calibration_path(&from_env);
  if (path.empty() || (!from_env && !exists(path))) {
    return std::string("preset figures (no link calibration for this machine; `piper calibrate --ranks R` writes one)");
  }
  Status st = load_comm_calibration(path, cluster, &info);
  if (!st.ok()) {
    return st.with_context(std::string(from_env ? "PIPER_COMM_CALIBRATION" : "the default link calibration file") +
                           " (run `piper calibrate --ranks R` again, or set PIPER_COMM_CALIBRATION=none to use the "
                           "preset figures)");
  }
  return path + (from_env ? " (PIPER_COMM_CALIBRATION" : " (this machine's default link calibration") +
         sync_note(info, *cluster) + ")";
}

Result<DeviceCalibration> load_device_calibration(const std::string& flag, const std::string& cluster_name) {
  DeviceCalibration d;
  if (!flag.empty()) {
    PIPER_ASSIGN_OR_RETURN(d.calibration, cost::Calibration::load(flag));
    d.path = flag;
    d.source = flag + " (--calibration)";
    return d;
  }
  if (cluster_name != kThisMachineCluster) {
    d.source = "preset figures (no --calibration file)";
    return d;
  }
  bool from_env = false;
  const std::string path = default_calibration_path(&from_env);
  if (path.empty() || (!from_env && !exists(path))) {
    d.source = "preset figures (no calibration file for this machine; `piper calibrate` writes one)";
    return d;
  }
  auto loaded = cost::Calibration::load(path);
  if (!loaded.ok()) {
    return loaded.status().with_context(std::string(from_env ? "PIPER_CALIBRATION" : "the default calibration file") +
                                        " (run `piper calibrate` again, or set PIPER_CALIBRATION=none to use the "
                                        "preset figures)");
  }
  d.calibration = *loaded;
  d.path = path;
  d.source = path + (from_env ? " (PIPER_CALIBRATION)" : " (this machine's default calibration)");
  return d;
}

bool scale_to_rank_cores(cost::Calibration* c, double rank_cores) {
  c->rank_threads = rank_cores == static_cast<int>(rank_cores) ? static_cast<int>(rank_cores) : 0;  // 0: not whole
  const cost::Calibration::ThreadFigures* f = c->rank_threads > 0 ? c->figures_for_threads(c->rank_threads) : nullptr;
  if (f == nullptr || !(c->peak_flops_fp32 > 0)) {
    c->peak_flops_fp32 *= rank_cores;
    c->memory_bw_bytes_per_s *= rank_cores;
    return false;
  }
  c->peak_flops_fp32 = f->peak_flops_fp32;
  c->gemm_half_dim = f->gemm_half_dim;
  c->memory_bw_bytes_per_s = f->memory_bw_bytes_per_s;
  return true;
}

std::string with_task_profile(const std::string& source, const cost::Calibration& c, const ModelSpec& model,
                              int64_t seq) {
  const std::string note = cost::task_profile_note(c, model, seq);
  return note.empty() ? source : source + ", " + note;
}

}  // namespace piper::cli
