#include "piper/tensor/rng.h"

#include <cmath>

namespace piper {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c0, &hi0, &lo0);
    mulhilo(kPhiloxM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {c0, c1, c2, c3};
}

uint32_t Rng::bits_at(uint64_t index) const { return philox4x32(state_.seed, state_.stream, index)[0]; }

float Rng::uniform_at(uint64_t index) const { return static_cast<float>(bits_at(index) >> 8) * (1.0f / 16777216.0f); }

float Rng::normal_at(uint64_t index) const {
  const auto w = philox4x32(state_.seed, state_.stream, index);
  // u1 in (0, 1] so that log() is finite; 53-bit-ish precision from two words.
  const double u1 = (static_cast<double>(w[0]) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(w[1]) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t Rng::next_below(uint64_t n) {
  const auto w = philox4x32(state_.seed, state_.stream, state_.counter++);
  const uint64_t r = (static_cast<uint64_t>(w[0]) << 32) | w[1];
  return r % n;
}

void fill_normal(float* out, int64_t n, const Rng& rng, uint64_t offset, float mean, float stddev) {
  for (int64_t i = 0; i < n; ++i) out[i] = mean + stddev * rng.normal_at(offset + static_cast<uint64_t>(i));
}

void fill_uniform(float* out, int64_t n, const Rng& rng, uint64_t offset, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) out[i] = lo + (hi - lo) * rng.uniform_at(offset + static_cast<uint64_t>(i));
}

void fill_normal(double* out, int64_t n, const Rng& rng, uint64_t offset, double mean, double stddev) {
  for (int64_t i = 0; i < n; ++i) out[i] = mean + stddev * static_cast<double>(rng.normal_at(offset + i));
}

}  // namespace piper
