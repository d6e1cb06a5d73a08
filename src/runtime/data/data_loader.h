// Batches of training sequences from a token stream, in a deterministic shuffled order.
//
// The stream is cut into windows of seq_len + 1 tokens starting every seq_len tokens (inputs = the first seq_len,
// targets = the last seq_len, shifted by one). Each epoch visits every window once, in an order that is a
// Fisher-Yates shuffle driven by Rng(seed, epoch): the same seed gives the same batches on any machine.
// The position (epoch, index within the epoch) is all a checkpoint needs to resume the exact same sequence.
// Thread-safety: one loader per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "piper/base/status.h"

namespace piper {

struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // windows already consumed in this epoch
};

struct Batch {
  int64_t batch_size = 0;
  int64_t seq_len = 0;
  std::vector<int32_t> inputs;   // [batch_size, seq_len]
  std::vector<int32_t> targets;  // [batch_size, seq_len]
};

class DataLoader {
 public:
  // InvalidArgument if seq_len or batch_size < 1, or the stream is shorter than one window (names both sizes).
  static Result<DataLoader> create(std::vector<uint16_t> tokens, int64_t seq_len, int64_t batch_size, uint64_t seed);

  int64_t num_windows() const { return num_windows_; }
  const DataPosition& position() const { return position_; }
  // InvalidArgument if the index is past the number of windows.
  Status seek(const DataPosition& position);
  // Fills the next batch_size windows (crossing into the next epoch when needed).
  void next_batch(Batch* batch);

 private:
  DataLoader() = default;
  void shuffle_epoch();
  std::vector<uint16_t> tokens_;
  int64_t seq_len_ = 0, batch_size_ = 0, num_windows_ = 0;
  uint64_t seed_ = 0;
  DataPosition position_;
  std::vector<int64_t> order_;  // window order of position_.epoch
};

}  // namespace piper
