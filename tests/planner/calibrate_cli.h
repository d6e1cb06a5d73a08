// Helpers of the tests that run `piper calibrate` through the binary (calibrate_fit_test.cc, calibrate_links_test.cc).
#pragma once

#include <array>
#include <cstdio>
#include <string>

namespace piper::cli {

// Runs `env_prefix piper args` through the shell; stdout and stderr in *text; the exit status.
inline int run_piper(const std::string& env_prefix, const std::string& args, std::string* text) {
  const std::string cmd = env_prefix + " " + std::string(PIPER_BIN_PATH) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  text->clear();
  while (size_t n = fread(buf.data(), 1, buf.size(), f)) text->append(buf.data(), n);
  return pclose(f);
}

inline bool too_noisy(const std::string& text) { return text.find("too noisy to fit") != std::string::npos; }

// `piper calibrate` (serial in CTest, so no other test runs beside it). A machine loaded from outside can still
// bend the measured curve, which the command refuses to fit; it is tried up to three times before the caller skips.
inline int run_calibrate(const std::string& env_prefix, const std::string& args, std::string* text) {
  int rc = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    rc = run_piper(env_prefix, "calibrate --rounds 3 " + args, text);
    if (rc == 0 || !too_noisy(*text)) break;
  }
  return rc;
}

}  // namespace piper::cli
