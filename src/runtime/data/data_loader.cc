#include "piper/runtime/data/data_loader.h"

#include <numeric>
#include <utility>

#include "piper/tensor/rng.h"

namespace piper {

Result<DataLoader> DataLoader::create(std::vector<uint16_t> tokens, int64_t seq_len, int64_t batch_size,
                                      uint64_t seed) {
  if (seq_len < 1 || batch_size < 1) {
    return invalid_argument("data loader: seq_len (" + std::to_string(seq_len) + ") and batch size (" +
                            std::to_string(batch_size) + ") must be at least 1");
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n < seq_len + 1) {
    return invalid_argument("data loader: the corpus has " + std::to_string(n) +
                            " tokens, fewer than one sequence of " + std::to_string(seq_len) +
                            " + 1; use a larger --data file or a smaller --seq");
  }
  DataLoader loader;
  loader.tokens_ = std::move(tokens);
  loader.seq_len_ = seq_len;
  loader.batch_size_ = batch_size;
  loader.num_windows_ = (n - 1) / seq_len;
  loader.seed_ = seed;
  loader.shuffle_epoch();
  return loader;
}

void DataLoader::shuffle_epoch() {
  order_.resize(static_cast<size_t>(num_windows_));
  std::iota(order_.begin(), order_.end(), 0);
  Rng rng(seed_, static_cast<uint64_t>(position_.epoch));
  for (int64_t i = num_windows_ - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(i + 1)));
    std::swap(order_[i], order_[j]);
  }
}

Status DataLoader::seek(const DataPosition& position) {
  if (position.epoch < 0 || position.index < 0 || position.index > num_windows_) {
    return invalid_argument("data position (epoch " + std::to_string(position.epoch) + ", index " +
                            std::to_string(position.index) + ") is outside this corpus of " +
                            std::to_string(num_windows_) + " sequences; was the checkpoint made with other data?");
  }
  position_ = position;
  shuffle_epoch();
  return ok_status();
}

void DataLoader::next_batch(Batch* batch) {
  batch->batch_size = batch_size_;
  batch->seq_len = seq_len_;
  batch->inputs.resize(static_cast<size_t>(batch_size_ * seq_len_));
  batch->targets.resize(static_cast<size_t>(batch_size_ * seq_len_));
  for (int64_t b = 0; b < batch_size_; ++b) {
    if (position_.index == num_windows_) {
      ++position_.epoch;
      position_.index = 0;
      shuffle_epoch();
    }
    const int64_t start = order_[position_.index++] * seq_len_;
    for (int64_t t = 0; t < seq_len_; ++t) {
      batch->inputs[b * seq_len_ + t] = tokens_[start + t];
      batch->targets[b * seq_len_ + t] = tokens_[start + t + 1];
    }
  }
}

}  // namespace piper
