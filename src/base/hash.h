// 64-bit FNV-1a over bytes and its 16-digit hex form: the one checksum of checkpoints
// (runtime/checkpoint/safetensors.h), of plans (compile::plan_hash) and of the parameter names that seed each
// tensor's RNG stream.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace piper {

inline constexpr uint64_t kFnv1a64Basis = 0xcbf29ce484222325ull;

// FNV-1a, 64 bit, over `bytes` bytes at `data`, starting from `hash` (the standard offset basis by default).
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t hash = kFnv1a64Basis);

// "%016x": 16 lower-case hex digits, as checkpoint indexes and `piper train --json` carry hashes.
std::string hex64(uint64_t v);

}  // namespace piper
