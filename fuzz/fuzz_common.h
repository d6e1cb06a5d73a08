// Helpers shared by the libFuzzer targets in this folder (one <target>_fuzz.cc per parser or loader).
//
// A target feeds the bytes to the library's real entry point and must never crash: every malformed input is a
// Status. Where an input loads, the target also checks an invariant that a bug would break (a round trip
// through the writer gives the same object) and aborts with a message when it does not, so that libFuzzer saves
// the input like any crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace piper::fuzz {

inline std::string as_text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// Aborts (a crash for libFuzzer) when an invariant of a loaded input does not hold.
inline void require(bool ok, const char* invariant, const std::string& detail = "") {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant violated: %s\n%s\n", invariant, detail.c_str());
  std::abort();
}

}  // namespace piper::fuzz
