// Tensor-parallel slices (model/chunks/tp_slice.h): the slices' parameters assemble into the whole chunk's, and the
// slices' partial outputs and input gradients sum to the whole chunk's (forward and backward), their split
// weight gradients are the slices of the whole's and their norm-weight gradients sum to the whole's.
#include "piper/runtime/model/chunks/tp_slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "piper/runtime/model/model.h"
#include "piper/spec/model_loader.h"
#include "piper/tensor/rng.h"

namespace piper::runtime {
namespace {

constexpr int kTp = 2;

ChunkDims tiny_dims() { return runtime_dims(load_model("tiny-moe").value()).value(); }

// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of the 2-D tensor `t`, flattened.
std::vector<float> block(const Tensor& t, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  std::vector<float> out;
  const int64_t w = t.shape()[1];
  for (int64_t r = r0; r < r0 + rows; ++r) out.insert(out.end(), t.data() + r * w + c0, t.data() + r * w + c0 + cols);
  return out;
}
std::vector<float> all(const Tensor& t) { return std::vector<float>(t.data(), t.data() + t.numel()); }

void expect_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - double(want[i])));
  EXPECT_LE(worst, 2e-6) << what;
}

struct Run {
  std::vector<float> y, dx;
};

// F then BW of `c` on input `x` [n, h] with output gradient `dy`.
Run run(Chunk& c, const Tensor& x, const Tensor& dy, int64_t batch, int64_t seq) {
  StepContext ctx;
  std::vector<int32_t> ids(static_cast<size_t>(batch * seq), 0);
  Microbatch mb{ids.data(), ids.data(), batch, seq};
  Activation in;
  in.hidden = std::make_shared<Tensor>(x.clone());
  Activation out;
  auto stash = c.forward(ctx, mb, {&in}, &out);
  EXPECT_TRUE(stash.ok()) << stash.status().to_string();
  Gradient g;
  g.dhidden = std::make_shared<Tensor>(dy.clone());
  Gradient dx;
  EXPECT_TRUE(c.backward_input(ctx, {&g}, **stash, &dx).ok());
  c.backward_weight(ctx, **stash);
  return Run{all(*out.hidden), all(*dx.dhidden)};
}

Tensor random(int64_t n, int64_t h, uint64_t stream) {
  Tensor t = Tensor::zeros_or_die({n, h}, MemCategory::kActivations);
  Rng rng(7, stream);
  fill_normal(t.data(), t.numel(), rng, 0, 0.0f, 1.0f);
  return t;
}

void check_part(Part part) {
  const std::string name = chunk_name(part);
  const ChunkDims d = tiny_dims();
  const int64_t batch = 2, seq = 8, n = batch * seq, h = d.hidden;
  auto whole = make_chunk(part, 0, d, 1234, nullptr).value();
  const Tensor x = random(n, h, 1), dy = random(n, h, 2);
  const Run want = run(*whole, x, dy, batch, seq);
  std::vector<float> y(want.y.size(), 0.0f), dx(want.dx.size(), 0.0f), dnorm(static_cast<size_t>(h), 0.0f);
  for (int r = 0; r < kTp; ++r) {
    auto slice = make_tp_slice(*whole, d, r, kTp, nullptr);
    ASSERT_TRUE(slice.ok()) << slice.status().to_string();
    auto& s = (*slice)->params();
    auto& w = whole->params();
    ASSERT_EQ(s.size(), w.size());
    EXPECT_EQ(all(s[0].value), all(w[0].value)) << "norm weight is replicated";
    EXPECT_FALSE(tp_param_split(s[0]));
    if (part == Part::kAttention) {
      const int64_t hd = d.head_dim, q = d.num_heads * hd / kTp, k = d.num_kv_heads * hd / kTp;
      const int64_t qd = d.num_heads * hd, kd = d.num_kv_heads * hd;
      std::vector<float> qkv = block(w[1].value, r * q, q, 0, h);
      for (int64_t base : {qd + r * k, qd + kd + r * k}) {
        std::vector<float> b = block(w[1].value, base, k, 0, h);
        qkv.insert(qkv.end(), b.begin(), b.end());
      }
      EXPECT_EQ(all(s[1].value), qkv) << "w_qkv rows of this rank's heads";
      EXPECT_EQ(all(s[2].value), block(w[2].value, 0, h, r * q, q)) << "wo columns of this rank's heads";
    } else {
      const int64_t f = w[1].value.shape()[0] / kTp;
      EXPECT_EQ(all(s[1].value), block(w[1].value, r * f, f, 0, h));
      EXPECT_EQ(all(s[2].value), block(w[2].value, r * f, f, 0, h));
      EXPECT_EQ(all(s[3].value), block(w[3].value, 0, h, r * f, f));
    }
    const Run got = run(**slice, x, dy, batch, seq);
    for (size_t i = 0; i < y.size(); ++i) y[i] += got.y[i];
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += got.dx[i];
    for (int64_t i = 0; i < h; ++i) dnorm[static_cast<size_t>(i)] += s[0].grad.data()[i];
    // Split weights: this rank's gradient is the slice of the whole chunk's.
    if (part == Part::kAttention) {
      const int64_t q = d.num_heads * d.head_dim / kTp;
      expect_near(all(s[2].grad), block(w[2].grad, 0, h, r * q, q), name + " wo gradient slice");
    } else {
      const int64_t f = w[1].value.shape()[0] / kTp;
      expect_near(all(s[1].grad), block(w[1].grad, r * f, f, 0, h), name + " w_gate gradient slice");
      expect_near(all(s[3].grad), block(w[3].grad, 0, h, r * f, f), name + " w_down gradient slice");
    }
  }
  expect_near(y, want.y, name + " output = sum of the slices' outputs");
  expect_near(dx, want.dx, name + " input gradient = sum of the slices'");
  expect_near(dnorm, all(whole->params()[0].grad), name + " norm gradient = sum of the slices'");
}

TEST(TpSlice, AttentionHeadsAssembleAndSum) { check_part(Part::kAttention); }
TEST(TpSlice, MlpUnitsAssembleAndSum) { check_part(Part::kDenseMlp); }

// tp_overlap's row pieces (PiecewiseChunk): F and B run with the first GEMM's rows in one order and the last GEMM's
// in uneven blocks in another give the whole chunk's output, input gradient and weight gradients.
Run run_pieces(Chunk& c, const Tensor& x, const Tensor& dy, int64_t batch, int64_t seq) {
  PiecewiseChunk* pc = c.piecewise();
  EXPECT_NE(pc, nullptr) << c.name();
  if (pc == nullptr) return {};
  const int64_t n = batch * seq, h = x.shape()[1];
  const std::vector<RowRange> in_rows = {{n / 2, n}, {0, n / 2}};            // shard 1, then shard 0
  const std::vector<RowRange> out_rows = {{9, 16}, {0, 3}, {8, 9}, {3, 8}};  // 7, 3, 1, 5 rows
  std::vector<int32_t> ids(static_cast<size_t>(n), 0);
  Microbatch mb{ids.data(), ids.data(), batch, seq};
  std::unique_ptr<Stash> st = pc->forward_begin(mb, std::make_shared<Tensor>(x.clone()));
  for (RowRange r : in_rows) pc->forward_in(*st, r);
  pc->forward_rest(*st);
  Tensor y = Tensor::zeros_or_die({n, h}, MemCategory::kActivations);
  for (RowRange r : out_rows) pc->forward_out(*st, r, &y);
  pc->backward_begin(*st, std::make_shared<Tensor>(dy.clone()));
  for (RowRange r : in_rows) pc->backward_in(*st, r);
  pc->backward_rest(*st);
  Tensor dx = Tensor::zeros_or_die({n, h}, MemCategory::kBuffers);
  for (RowRange r : out_rows) pc->backward_out(*st, r, &dx);
  c.backward_weight(StepContext{}, *st);
  return Run{all(y), all(dx)};
}

TEST(TpSlice, RowPiecesInAnyOrderEqualTheWholeChunk) {
  ChunkDims d = tiny_dims();
  d.num_shared_experts = 1;  // tiny-moe has none
  d.shared_intermediate = 128;
  for (Part part : {Part::kAttention, Part::kDenseMlp, Part::kSharedExperts}) {
    const std::string name = chunk_name(part);
    auto whole = make_chunk(part, 0, d, 1234, nullptr).value();
    auto pieces = make_chunk(part, 0, d, 1234, nullptr).value();
    const Tensor x = random(16, d.hidden, 1), dy = random(16, d.hidden, 2);
    const auto want = run(*whole, x, dy, 2, 8);
    const auto got = run_pieces(*pieces, x, dy, 2, 8);
    expect_near(got.y, want.y, name + " output");
    expect_near(got.dx, want.dx, name + " input gradient");
    for (size_t i = 0; i < whole->params().size(); ++i) {
      expect_near(all(pieces->params()[i].grad), all(whole->params()[i].grad), name + " gradient " + std::to_string(i));
    }
  }
}

// The slices' recorded places (Param::global_shape with global_offset or global_blocks, what checkpoints store
// them by) put every split parameter's elements where the whole chunk has them, each element exactly once.
void check_places(Part part) {
  const ChunkDims d = tiny_dims();
  auto whole = make_chunk(part, 0, d, 1234, nullptr).value();
  const auto& w = whole->params();
  std::vector<std::vector<float>> assembled(w.size());
  std::vector<std::vector<int>> hits(w.size());
  std::vector<std::unique_ptr<Chunk>> slices;
  for (int r = 0; r < kTp; ++r) {
    auto slice = make_tp_slice(*whole, d, r, kTp, nullptr);
    ASSERT_TRUE(slice.ok()) << slice.status().to_string();
    slices.push_back(std::move(slice).value());
  }
  for (size_t i = 0; i < w.size(); ++i) {
    if (!tp_param_split(slices[0]->params()[i])) {
      for (const auto& slice : slices) {
        const Param& p = slice->params()[i];
        EXPECT_TRUE(p.global_shape.empty() && p.global_blocks.empty()) << p.name << " is replicated: whole";
      }
      continue;
    }
    ASSERT_EQ(w[i].value.shape().size(), 2u) << w[i].name;
    const int64_t cols = w[i].value.shape()[1];
    assembled[i].assign(static_cast<size_t>(w[i].value.numel()), 0.0f);
    hits[i].assign(assembled[i].size(), 0);
    for (const auto& slice : slices) {
      const Param& p = slice->params()[i];
      EXPECT_EQ(p.global_shape, w[i].value.shape()) << p.name;
      // One box at global_offset, or the listed row blocks.
      std::vector<Param::RowBlock> boxes = p.global_blocks;
      if (boxes.empty()) boxes.push_back({0, p.value.shape()[0], p.global_offset});
      int64_t rows = 0;
      for (const Param::RowBlock& b : boxes) {
        ASSERT_EQ(b.offset.size(), 2u) << p.name;
        const int64_t width = p.value.shape()[1];
        ASSERT_LE(b.offset[0] + b.rows, w[i].value.shape()[0]) << p.name;
        ASSERT_LE(b.offset[1] + width, cols) << p.name;
        for (int64_t r = 0; r < b.rows; ++r) {
          for (int64_t c = 0; c < width; ++c) {
            const size_t at = static_cast<size_t>((b.offset[0] + r) * cols + b.offset[1] + c);
            assembled[i][at] = p.value.data()[(b.row + r) * width + c];
            ++hits[i][at];
          }
        }
        rows += b.rows;
      }
      EXPECT_EQ(rows, p.value.shape()[0]) << p.name << ": the blocks cover every row of the slice";
    }
    EXPECT_EQ(assembled[i], all(w[i].value)) << w[i].name << " assembled from its slices' places";
    EXPECT_EQ(std::count(hits[i].begin(), hits[i].end(), 1), static_cast<long>(hits[i].size()))
        << w[i].name << ": every element placed exactly once";
  }
}

TEST(TpSlice, AttentionSlicesRecordTheirPlace) { check_places(Part::kAttention); }
TEST(TpSlice, MlpSlicesRecordTheirPlace) { check_places(Part::kDenseMlp); }

TEST(TpSlice, VocabularySlicesRecordTheirPlace) {
  check_places(Part::kEmbedding);
  check_places(Part::kHead);
}

// Vocabulary parallelism: the embed slices' outputs sum to the whole lookup and their table gradients are the
// whole's rows, bit for bit (a copy and a sum with zeros).
TEST(TpSlice, EmbedSlicesSumToTheWholeLookup) {
  const ChunkDims d = tiny_dims();
  const int64_t batch = 2, seq = 8, n = batch * seq;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 3) % d.vocab);
  ids[1] = ids[0];  // a repeated id: its gradients add up
  const Microbatch mb{ids.data(), ids.data(), batch, seq};
  const Tensor dy = random(n, d.hidden, 2);
  auto run_embed = [&](Chunk& c) {
    Activation out;
    auto stash = c.forward(StepContext{}, mb, {}, &out);
    EXPECT_TRUE(stash.ok()) << stash.status().to_string();
    Gradient g, dx;
    g.dhidden = std::make_shared<Tensor>(dy.clone());
    EXPECT_TRUE(c.backward_input(StepContext{}, {&g}, **stash, &dx).ok());
    c.backward_weight(StepContext{}, **stash);
    return all(*out.hidden);
  };
  for (int tp : {2, 4}) {
    auto whole = make_chunk(Part::kEmbedding, 0, d, 1234, nullptr).value();
    const std::vector<float> want = run_embed(*whole);
    std::vector<float> sum(want.size(), 0.0f);
    const int64_t rows = d.vocab / tp;
    for (int r = 0; r < tp; ++r) {
      auto slice = make_tp_slice(*whole, d, r, tp, nullptr);
      ASSERT_TRUE(slice.ok()) << slice.status().to_string();
      const std::vector<float> got = run_embed(**slice);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
      EXPECT_EQ(all((*slice)->params()[0].grad), block(whole->params()[0].grad, r * rows, rows, 0, d.hidden))
          << "tp=" << tp << ": table gradient rows of rank " << r;
    }
    EXPECT_EQ(sum, want) << "tp=" << tp;
  }
}

// The tp all-gather of `size` threads in one process (StepContext::gather_over_vocab of each thread's slice).
class ThreadGather {
 public:
  explicit ThreadGather(int size) : size_(size), parts_(static_cast<size_t>(size)) {}
  Status gather(int rank, const float* mine, float* all, int64_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    parts_[static_cast<size_t>(rank)].assign(mine, mine + count);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return arrived_ == size_; });
    for (int r = 0; r < size_; ++r) std::copy(parts_[r].begin(), parts_[r].end(), all + r * count);
    return ok_status();
  }

 private:
  int size_, arrived_ = 0;
  std::vector<std::vector<float>> parts_;
  std::mutex mu_;
  std::condition_variable cv_;
};

struct HeadRun {
  double loss = 0;
  std::vector<float> dx;
};

HeadRun run_head(Chunk& c, const StepContext& ctx, const Tensor& x, const Microbatch& mb) {
  Activation in, out;
  in.hidden = std::make_shared<Tensor>(x.clone());
  auto stash = c.forward(ctx, mb, {&in}, &out);
  EXPECT_TRUE(stash.ok()) << stash.status().to_string();
  if (!stash.ok()) return {};
  Gradient dx;
  EXPECT_TRUE(c.backward_input(ctx, {}, **stash, &dx).ok());
  c.backward_weight(ctx, **stash);
  return HeadRun{(*stash)->loss, all(*dx.dhidden)};
}

// Vocabulary parallelism: tp head slices, run on tp threads that gather their cross-entropy statistics, compute the
// whole head's loss; their input and norm-weight gradients sum to the whole's, their w_out gradients are its rows.
TEST(TpSlice, HeadSlicesComputeTheWholeCrossEntropy) {
  const ChunkDims d = tiny_dims();
  const int64_t batch = 2, seq = 8, n = batch * seq, h = d.hidden;
  std::vector<int32_t> ids(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 53 + 11) % d.vocab);
  const Microbatch mb{ids.data(), targets.data(), batch, seq};
  const Tensor x = random(n, h, 3);
  for (int tp : {2, 4}) {
    auto whole = make_chunk(Part::kHead, d.num_layers - 1, d, 1234, nullptr).value();
    const HeadRun want = run_head(*whole, StepContext{}, x, mb);
    std::vector<std::unique_ptr<Chunk>> slices;
    for (int r = 0; r < tp; ++r) slices.push_back(make_tp_slice(*whole, d, r, tp, nullptr).value());
    ThreadGather group(tp);
    std::vector<HeadRun> got(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        StepContext ctx;
        ctx.gather_over_vocab = [&, r](const float* mine, float* all, int64_t count) {
          return group.gather(r, mine, all, count);
        };
        got[static_cast<size_t>(r)] = run_head(*slices[static_cast<size_t>(r)], ctx, x, mb);
      });
    }
    for (std::thread& t : threads) t.join();
    const int64_t rows = d.vocab / tp;
    std::vector<float> dx(want.dx.size(), 0.0f), dnorm(static_cast<size_t>(h), 0.0f);
    for (int r = 0; r < tp; ++r) {
      EXPECT_NEAR(got[static_cast<size_t>(r)].loss, want.loss, 1e-6 * want.loss) << "tp=" << tp << " rank " << r;
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += got[static_cast<size_t>(r)].dx[i];
      const auto& p = slices[static_cast<size_t>(r)]->params();
      for (int64_t i = 0; i < h; ++i) dnorm[static_cast<size_t>(i)] += p[0].grad.data()[i];
      expect_near(all(p[1].grad), block(whole->params()[1].grad, r * rows, rows, 0, h), "w_out gradient rows");
    }
    expect_near(dx, want.dx, "head input gradient = sum of the slices'");
    expect_near(dnorm, all(whole->params()[0].grad), "head norm gradient = sum of the slices'");
  }
}

TEST(TpSlice, HeadSliceWithoutTheGatherIsAnError) {
  const ChunkDims d = tiny_dims();
  auto whole = make_chunk(Part::kHead, d.num_layers - 1, d, 1234, nullptr).value();
  auto slice = make_tp_slice(*whole, d, 0, 2, nullptr).value();
  std::vector<int32_t> ids(16, 1);
  const Microbatch mb{ids.data(), ids.data(), 2, 8};
  Activation in, out;
  in.hidden = std::make_shared<Tensor>(random(16, d.hidden, 3));
  auto stash = slice->forward(StepContext{}, mb, {&in}, &out);
  ASSERT_FALSE(stash.ok());
  EXPECT_NE(stash.status().message().find("gather_over_vocab"), std::string::npos) << stash.status().message();
}

TEST(TpSlice, BadSplitIsNamed) {
  ChunkDims d = tiny_dims();
  auto whole = make_chunk(Part::kAttention, 0, d, 1, nullptr).value();
  auto slice = make_tp_slice(*whole, d, 0, 4, nullptr);  // 2 KV heads over 4 ranks
  ASSERT_FALSE(slice.ok());
  EXPECT_NE(slice.status().message().find("key/value heads"), std::string::npos) << slice.status().message();
  auto head = make_chunk(Part::kHead, d.num_layers - 1, d, 1, nullptr).value();
  auto odd = make_tp_slice(*head, d, 0, 3, nullptr);  // vocab 256 over 3 ranks
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("does not divide vocab_size=256"), std::string::npos) << odd.status().message();
  EXPECT_NE(odd.status().message().find("pad vocab_size to a multiple of 3"), std::string::npos);
  auto router = make_chunk(Part::kRouter, 1, d, 1, nullptr).value();
  EXPECT_FALSE(make_tp_slice(*router, d, 0, 2, nullptr).ok());
}

}  // namespace
}  // namespace piper::runtime
