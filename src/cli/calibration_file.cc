#include "piper/cli/calibration_file.h"

#include <cstdlib>
#include <sys/stat.h>
#include <unistd.h>

#include "piper/base/files.h"

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

std::string default_calibration_path(bool* explicit_env) {
  const std::string named = env("PIPER_CALIBRATION");
  if (explicit_env != nullptr) *explicit_env = !named.empty() && named != "none";
  if (named == "none") return "";
  if (!named.empty()) return named;
  std::string base = env("XDG_CONFIG_HOME");
  if (base.empty()) {
    const std::string home = env("HOME");
    if (home.empty()) return "";
    base = home + "/.config";
  }
  return base + "/piper/calibration/" + host_name() + ".json";
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
  const cost::Calibration::ThreadFigures* f =
      rank_cores == static_cast<int>(rank_cores) ? c->figures_for_threads(static_cast<int>(rank_cores)) : nullptr;
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

}  // namespace piper::cli
