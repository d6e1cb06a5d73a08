// Helpers of the communication tests: hand-computable payloads and size matrices every rank can compute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "piper/comm/communicator.h"
#include "piper/comm/mpi/mpi_communicator.h"

namespace piper::comm::testing {

inline constexpr double kTestTimeoutS = 15.0;

// Byte i of the block that rank `src` sends to rank `dst`: a function of (src, dst, i) only.
inline uint8_t pattern_byte(int src, int dst, size_t i) {
  return static_cast<uint8_t>((src * 131 + dst * 31 + i * 7 + (i >> 8) * 3) & 0xff);
}

inline std::vector<uint8_t> pattern_block(int src, int dst, size_t bytes) {
  std::vector<uint8_t> block(bytes);
  for (size_t i = 0; i < bytes; ++i) block[i] = pattern_byte(src, dst, i);
  return block;
}

// Bytes that src sends to dst in a size matrix `sizes` (a function every rank evaluates identically).
using SizeFn = size_t (*)(int src, int dst, int size, uint64_t seed);

// Builds send buffer and counts of rank `me`, and the expected receive buffer and counts.
struct AllToAllCase {
  std::vector<size_t> send_bytes, recv_bytes;
  std::vector<uint8_t> send, expected;
};

inline AllToAllCase make_all_to_all_case(int me, int size, SizeFn fn, uint64_t seed) {
  AllToAllCase c;
  for (int p = 0; p < size; ++p) {
    size_t out = fn(me, p, size, seed);
    size_t in = fn(p, me, size, seed);
    c.send_bytes.push_back(out);
    c.recv_bytes.push_back(in);
    auto block = pattern_block(me, p, out);
    c.send.insert(c.send.end(), block.begin(), block.end());
    auto expect = pattern_block(p, me, in);
    c.expected.insert(c.expected.end(), expect.begin(), expect.end());
  }
  return c;
}

// A deterministic pseudo-random number from (seed, a, b) (splitmix64).
inline uint64_t mix(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (a * 1000003ULL + b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::unique_ptr<Communicator> world(const MpiOptions& options = {}) {
  auto w = mpi_world(options);
  if (!w.ok()) return nullptr;
  return std::move(w).value();
}

}  // namespace piper::comm::testing
