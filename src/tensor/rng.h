// Deterministic, counter-based random numbers (Philox4x32-10).
//
// Draw i of stream s under seed k is a pure function of (k, s, i): results do not depend on how work is split
// across threads or ranks, and the generator's whole state is three integers that a checkpoint can save.
// Rng hands out consecutive counters; the fill_* functions use counters [offset, offset + n) and are
// parallel-safe by construction.
// Thread-safety: a const Rng may be read from many threads; next_*() mutate and need external ordering.
#pragma once

#include <array>
#include <cstdint>

namespace piper {

// The 128 random bits of block `counter` (4 × 32-bit words) of stream `stream` under `seed`.
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

struct RngState {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t counter = 0;  // the next block to use
};

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0) : state_{seed, stream, 0} {}
  explicit Rng(const RngState& state) : state_(state) {}

  const RngState& state() const { return state_; }

  // Uniform in [0, 1) with 24 random bits (exactly representable as float).
  float uniform_at(uint64_t index) const;
  // Standard normal by Box-Muller over the block of `index`.
  float normal_at(uint64_t index) const;
  uint32_t bits_at(uint64_t index) const;

  float next_uniform() { return uniform_at(state_.counter++); }
  float next_normal() { return normal_at(state_.counter++); }
  uint32_t next_bits() { return bits_at(state_.counter++); }
  // Integer in [0, n) for n > 0, from 64 random bits (modulo bias below 2^-32 for n < 2^32).
  uint64_t next_below(uint64_t n);
  // Reserves `count` counters for a fill_* call and returns the first one.
  uint64_t reserve(uint64_t count) {
    const uint64_t first = state_.counter;
    state_.counter += count;
    return first;
  }

 private:
  RngState state_;
};

// out[i] = mean + stddev * normal_at(offset + i), or lo + (hi - lo) * uniform_at(offset + i).
void fill_normal(float* out, int64_t n, const Rng& rng, uint64_t offset, float mean, float stddev);
void fill_uniform(float* out, int64_t n, const Rng& rng, uint64_t offset, float lo, float hi);
void fill_normal(double* out, int64_t n, const Rng& rng, uint64_t offset, double mean, double stddev);

}  // namespace piper
