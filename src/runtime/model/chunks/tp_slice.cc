// Tensor-parallel slices of attn, mlp, shared, embed and head chunks (tp_slice.h).
#include "piper/runtime/model/chunks/tp_slice.h"

#include <algorithm>

#include "piper/runtime/model/chunks/parts.h"

namespace piper::runtime {
namespace {

// Copies rows [begin, begin + count) of the [rows, cols] tensor `src` into rows [at, at + count) of `dst`.
void copy_rows(const Tensor& src, int64_t begin, int64_t count, Tensor* dst, int64_t at) {
  const int64_t cols = src.shape()[1];
  std::copy(src.data() + begin * cols, src.data() + (begin + count) * cols, dst->data() + at * cols);
}

// Copies columns [begin, begin + dst.cols) of every row of `src` into `dst`.
void copy_cols(const Tensor& src, int64_t begin, Tensor* dst) {
  const int64_t rows = src.shape()[0], cols = src.shape()[1], width = dst->shape()[1];
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(src.data() + r * cols + begin, src.data() + r * cols + begin + width, dst->data() + r * width);
  }
}

Status divides(const Chunk& whole, const char* what, int64_t value, int size) {
  if (value % size == 0) return ok_status();
  return invalid_argument(whole.name() + ": tp=" + std::to_string(size) + " does not divide its " + what + " (" +
                          std::to_string(value) + "); pick a tp that divides it");
}

}  // namespace

bool tp_param_split(const Param& p) {
  const std::string suffix = ".norm";
  return !(p.name.size() >= suffix.size() && p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0);
}

Result<std::unique_ptr<Chunk>> make_tp_slice(const Chunk& whole, const ChunkDims& dims, int rank, int size,
                                             Allocator* allocator) {
  if (size < 1 || rank < 0 || rank >= size) {
    return invalid_argument("tensor-parallel slice " + std::to_string(rank) + " of " + std::to_string(size) +
                            " does not exist");
  }
  const bool residual = rank == 0;
  const Part part = whole.part();
  const auto& w = whole.params();
  std::unique_ptr<Chunk> slice;
  if (part == Part::kAttention) {
    PIPER_RETURN_IF_ERROR(divides(whole, "query heads", dims.num_heads, size));
    PIPER_RETURN_IF_ERROR(divides(whole, "key/value heads", dims.num_kv_heads, size));
    ChunkDims d = dims;
    d.num_heads = dims.num_heads / size;
    d.num_kv_heads = dims.num_kv_heads / size;
    slice = make_attn_chunk(whole.layer(), d, /*seed=*/0, allocator, residual);
    auto& s = slice->params();
    const int64_t hd = dims.head_dim, qd = dims.num_heads * hd, kd = dims.num_kv_heads * hd;
    const int64_t qd_r = d.num_heads * hd, kd_r = d.num_kv_heads * hd;
    std::copy(w[0].value.data(), w[0].value.data() + w[0].value.numel(), s[0].value.data());
    // w_qkv rows: [q heads | k heads | v heads]; this rank's heads of each block.
    copy_rows(w[1].value, rank * qd_r, qd_r, &s[1].value, 0);
    copy_rows(w[1].value, qd + rank * kd_r, kd_r, &s[1].value, qd_r);
    copy_rows(w[1].value, qd + kd + rank * kd_r, kd_r, &s[1].value, qd_r + kd_r);
    copy_cols(w[2].value, rank * qd_r, &s[2].value);
    // Their place in the whole tensors, for checkpoints: w_qkv as its three row blocks, wo as one column box.
    s[1].global_shape = w[1].value.shape();
    s[1].global_blocks = {{0, qd_r, {rank * qd_r, 0}},
                          {qd_r, kd_r, {qd + rank * kd_r, 0}},
                          {qd_r + kd_r, kd_r, {qd + kd + rank * kd_r, 0}}};
    s[2].global_shape = w[2].value.shape();
    s[2].global_offset = {0, rank * qd_r};
  } else if (part == Part::kDenseMlp || part == Part::kSharedExperts) {
    const int64_t width = w[1].value.shape()[0];
    PIPER_RETURN_IF_ERROR(divides(whole, "intermediate width", width, size));
    const int64_t f = width / size;
    const bool add_residual = part == Part::kDenseMlp && residual;
    slice = make_ffn_chunk(part, whole.layer(), dims, f, add_residual, /*seed=*/0, allocator);
    auto& s = slice->params();
    std::copy(w[0].value.data(), w[0].value.data() + w[0].value.numel(), s[0].value.data());
    copy_rows(w[1].value, rank * f, f, &s[1].value, 0);
    copy_rows(w[2].value, rank * f, f, &s[2].value, 0);
    copy_cols(w[3].value, rank * f, &s[3].value);
    for (int i : {1, 2}) {
      s[i].global_shape = w[i].value.shape();
      s[i].global_offset = {rank * f, 0};
    }
    s[3].global_shape = w[3].value.shape();
    s[3].global_offset = {0, rank * f};
  } else if (part == Part::kEmbedding || part == Part::kHead) {
    if (dims.vocab % size != 0) {
      return invalid_argument(whole.name() + ": tp=" + std::to_string(size) +
                              " does not divide vocab_size=" + std::to_string(dims.vocab) +
                              "; the runtime splits the vocabulary's rows evenly over tp " +
                              "and does not pad them (Megatron's --make-vocab-size-divisible-by): pad vocab_size to " +
                              "a multiple of " + std::to_string(size) + " or pick a tp that divides it");
    }
    const VocabSlice vs{rank, size};
    slice = part == Part::kEmbedding ? make_embed_chunk(whole.layer(), dims, /*seed=*/0, allocator, vs)
                                     : make_head_chunk(whole.layer(), dims, /*seed=*/0, allocator, vs);
    auto& s = slice->params();
    for (size_t i = 0; i < s.size(); ++i) {
      if (!tp_param_split(s[i])) {  // the head's norm weight
        std::copy(w[i].value.data(), w[i].value.data() + w[i].value.numel(), s[i].value.data());
        continue;
      }
      copy_rows(w[i].value, vs.begin(dims.vocab), vs.rows(dims.vocab), &s[i].value, 0);
      s[i].global_shape = w[i].value.shape();
      s[i].global_offset = {vs.begin(dims.vocab), 0};
    }
  } else {
    return invalid_argument("no tensor-parallel slice for part '" + std::string(chunk_name(part)) + "' (" +
                            whole.name() + "); the compiler shards attn, mlp, shared, embed and head over tp");
  }
  return slice;
}

Result<std::unique_ptr<Chunk>> make_etp_slice(const Chunk& whole, const ChunkDims& dims, int rank, int size,
                                              Allocator* allocator) {
  if (whole.part() != Part::kExperts || whole.params().size() != 3) {
    return invalid_argument("no expert tensor-parallel slice for " + whole.name() + "; etp slices experts chunks");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return invalid_argument("expert tensor-parallel slice " + std::to_string(rank) + " of " + std::to_string(size) +
                            " does not exist");
  }
  const int64_t width = dims.expert_intermediate;
  if (width % size != 0) {
    return invalid_argument(whole.name() + ": etp=" + std::to_string(size) + " does not divide the expert " +
                            "intermediate width (" + std::to_string(width) + "); pick an etp that divides it");
  }
  ChunkDims d = dims;
  d.expert_intermediate = width / size;
  const int64_t f = d.expert_intermediate, h = dims.hidden, experts = dims.local_experts();
  std::unique_ptr<Chunk> slice = make_experts_chunk(whole.layer(), d, /*seed=*/0, allocator);
  const auto& w = whole.params();
  auto& s = slice->params();
  for (int64_t e = 0; e < experts; ++e) {
    // w_gate, w_up [E, F, h]: rows [rank f, (rank + 1) f) of each expert; w_down [E, h, F]: those columns.
    for (int i : {0, 1}) {
      const float* from = w[static_cast<size_t>(i)].value.data() + (e * width + rank * f) * h;
      std::copy(from, from + f * h, s[static_cast<size_t>(i)].value.data() + e * f * h);
    }
    for (int64_t r = 0; r < h; ++r) {
      const float* from = w[2].value.data() + (e * h + r) * width + rank * f;
      std::copy(from, from + f, s[2].value.data() + (e * h + r) * f);
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    s[i].global_shape = w[i].global_shape.empty() ? w[i].value.shape() : w[i].global_shape;
    s[i].global_offset = w[i].global_offset.empty() ? Shape(3, 0) : w[i].global_offset;
    s[i].global_offset[i == 2 ? 2 : 1] = rank * f;
  }
  return slice;
}

}  // namespace piper::runtime
