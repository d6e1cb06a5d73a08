// Range-checked numeric command-line options, and the bounds they share.
//
// Every numeric flag of every command is added through add_int_option / add_real_option with its valid range:
// the value is checked as it is parsed, and a bad one fails with one line that names the flag, the value, the
// range and what the range means ("--seq: 0 is outside [1, 1048576] (tokens per sequence); give a value in
// that range"). A flag that is not given keeps the variable's initial value, which may lie outside the range
// (0 for "not given"): commands tell "not given" from a value that way, and 0 given by the user is refused.
// docs/reliability.md ("Input ranges: command-line flags and outputs") lists every flag with its range.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "piper/base/status.h"
#include "piper/spec/limits.h"
#include "piper/spec/model_spec.h"

namespace piper::cli {

// Bounds shared by several commands. Each is far above any real run and low enough that the arrays sized by
// it (per-step token buffers, per-microbatch graph nodes, per-rank schedules) fit in memory.
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;       // tokens per sequence (the longest context is 163840)
using piper::kMaxGlobalBatch;                                // sequences per optimizer step (spec/limits.h)
inline constexpr int64_t kMaxMicrobatches = 4096;             // the graph holds every layer's chunks per microbatch
inline constexpr int64_t kMaxNodes = 65536;                   // nodes of a cluster
inline constexpr int64_t kMaxMeshDegree = 4096;               // ranks along one mesh axis
inline constexpr int64_t kMaxWorldSize = 65536;               // ranks of one plan (compile's per-rank programs)
inline constexpr int64_t kMaxThreads = 1024;                  // worker threads
inline constexpr int64_t kMaxLocalRanks = 64;                 // MPI ranks started on this machine (oversubscribed)
inline constexpr int64_t kMaxSteps = 1000000000;              // optimizer steps
using piper::kMaxLearningRate;                               // AdamW's peak lr (spec/limits.h)
inline constexpr double kMaxCapacityGib = 1048576;            // 1 PiB of device memory

struct IntRange {
  int64_t lo = 0;
  int64_t hi = 0;
  std::string meaning;  // what the value counts, e.g. "tokens per sequence"
};

struct RealRange {
  double lo = 0;
  double hi = 0;
  bool lo_open = false;  // (lo, hi] instead of [lo, hi]
  std::string meaning;
};

// Checks one flag's text against a range; "" when it is valid, else the message (without the flag's name, which
// CLI11 prepends). Non-finite reals (nan, inf) are always refused.
std::string check_int_text(const std::string& text, const IntRange& range);
std::string check_real_text(const std::string& text, const RealRange& range);

CLI::Validator int_range(const IntRange& range);
CLI::Validator real_range(const RealRange& range);

template <typename T>
CLI::Option* add_int_option(CLI::App* sub, const std::string& name, T* value, const IntRange& range,
                            const std::string& help) {
  return sub->add_option(name, *value, help)->check(int_range(range));
}

inline CLI::Option* add_real_option(CLI::App* sub, const std::string& name, double* value, const RealRange& range,
                                    const std::string& help) {
  return sub->add_option(name, *value, help)->check(real_range(range));
}

// --seq for a model: `given` 0 (not given) becomes min(4096, max_seq_len); a value above the model's max_seq_len
// is refused as `piper train` refuses it, so estimate, simulate, plan and compile agree with train.
Result<int64_t> resolve_seq_len(const ModelSpec& model, int64_t given);

// The same check for a value already chosen (train's default 128, a planner's choice).
Status check_seq_len(const ModelSpec& model, int64_t seq_len);

}  // namespace piper::cli
