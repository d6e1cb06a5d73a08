// The vocabulary-parallel kernels (ops.h, "Vocabulary parallelism") against the whole-vocabulary ones: T shards
// of the table / of w_out, with the cross-entropy statistics gathered as the tp all-gather would, give the whole
// lookup, loss, softmax, input gradient (summed over the shards) and weight gradient (the shards' rows); one
// shard gives the whole kernels' bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "fd_util.h"
#include "piper/kernels/cpu/gemm.h"
#include "piper/kernels/cpu/ops.h"

namespace piper::kernels {
namespace {

using FVec = std::vector<float>;
using testing::random_vec;

constexpr int64_t kN = 19, kD = 13, kVocab = 36;  // 36: split in 1, 2, 3 and 4 shards

std::vector<int32_t> token_ids(uint64_t step) {
  std::vector<int32_t> ids(kN);
  for (int64_t i = 0; i < kN; ++i) ids[i] = static_cast<int32_t>((i * step + 5) % kVocab);
  return ids;
}

// Rows [begin, begin + rows) of a [*, cols] matrix.
FVec rows_of(const FVec& m, int64_t begin, int64_t rows, int64_t cols) {
  return FVec(m.begin() + begin * cols, m.begin() + (begin + rows) * cols);
}

double max_abs_diff(const FVec& a, const FVec& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
  return worst;
}

struct Head {
  float loss = 0;
  FVec probs, dh, dw;  // probs [n, rows], dh [n, d], dw [rows, d]
};

// The whole-vocabulary head: forward, B with dloss = 1, W.
Head whole_head(const FVec& h, const FVec& w, const std::vector<int32_t>& targets) {
  Head out{0, FVec(kN * kVocab), FVec(kN * kD), FVec(kVocab * kD, 0.0f)};
  FVec dlogits(kN * kVocab);
  lm_head_loss_forward(&out.loss, out.probs.data(), h.data(), w.data(), targets.data(), kN, kD, kVocab);
  lm_head_loss_backward_input(out.dh.data(), dlogits.data(), out.probs.data(), targets.data(), w.data(), 1.0f, kN, kD,
                              kVocab);
  lm_head_loss_backward_weight(out.dw.data(), dlogits.data(), h.data(), kN, kD, kVocab);
  return out;
}

// The T shards of the head, the statistics all-gathered in shard order between the two forward steps.
std::vector<Head> sharded_head(const FVec& h, const FVec& w, const std::vector<int32_t>& targets, int shards) {
  const int64_t rows = kVocab / shards;
  std::vector<Head> out(static_cast<size_t>(shards));
  FVec all_stats(static_cast<size_t>(shards * kN * kVocabStats));
  for (int s = 0; s < shards; ++s) {
    Head& o = out[static_cast<size_t>(s)];
    o.probs.resize(kN * rows);
    const FVec ws = rows_of(w, s * rows, rows, kD);
    lm_head_shard_forward(o.probs.data(), all_stats.data() + s * kN * kVocabStats, h.data(), ws.data(), targets.data(),
                          kN, kD, s * rows, rows);
  }
  for (int s = 0; s < shards; ++s) {
    Head& o = out[static_cast<size_t>(s)];
    lm_head_shard_loss(&o.loss, o.probs.data(), all_stats.data(), shards, s, kN, rows);
    const FVec ws = rows_of(w, s * rows, rows, kD);
    FVec dlogits(kN * rows);
    o.dh.resize(kN * kD);
    o.dw.assign(rows * kD, 0.0f);
    lm_head_shard_backward_input(o.dh.data(), dlogits.data(), o.probs.data(), targets.data(), ws.data(), 1.0f, kN, kD,
                                 s * rows, rows);
    lm_head_loss_backward_weight(o.dw.data(), dlogits.data(), h.data(), kN, kD, rows);
  }
  return out;
}

TEST(VocabParallel, LmHeadShardsGiveTheWholeVocabularysLossAndGradients) {
  // Logits of a few units: the shards' maxima differ, so the rescaling to the global max is exercised.
  const FVec h = random_vec(kN * kD, 31, 2.0f), w = random_vec(kVocab * kD, 32);
  const std::vector<int32_t> targets = token_ids(7);
  const Head want = whole_head(h, w, targets);
  for (int shards : {1, 2, 3, 4}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    const int64_t rows = kVocab / shards;
    const std::vector<Head> got = sharded_head(h, w, targets, shards);
    FVec dh(kN * kD, 0.0f);
    for (int s = 0; s < shards; ++s) {
      const Head& g = got[static_cast<size_t>(s)];
      EXPECT_EQ(g.loss, got[0].loss) << "every shard computes the same loss";
      for (size_t i = 0; i < dh.size(); ++i) dh[i] += g.dh[i];
      // This shard's columns of the whole softmax and rows of the whole weight gradient.
      FVec probs;
      for (int64_t i = 0; i < kN; ++i) {
        probs.insert(probs.end(), want.probs.begin() + i * kVocab + s * rows,
                     want.probs.begin() + i * kVocab + (s + 1) * rows);
      }
      EXPECT_LE(max_abs_diff(g.probs, probs), 4e-7) << "softmax of shard " << s;
      EXPECT_LE(max_abs_diff(g.dw, rows_of(want.dw, s * rows, rows, kD)), 1e-6) << "w_out gradient of shard " << s;
      if (shards == 1) {
        EXPECT_EQ(0, std::memcmp(g.probs.data(), want.probs.data(), g.probs.size() * sizeof(float))) << "bits";
        EXPECT_EQ(0, std::memcmp(g.dw.data(), want.dw.data(), g.dw.size() * sizeof(float))) << "bits";
      }
    }
    EXPECT_NEAR(got[0].loss, want.loss, 1e-6 * std::abs(want.loss));
    EXPECT_LE(max_abs_diff(dh, want.dh), 1e-6) << "input gradient = the sum of the shards'";
    if (shards == 1) {
      EXPECT_EQ(got[0].loss, want.loss) << "one shard: the whole kernel's bits";
    }
  }
}

// A wrong shard in the rescale (every shard scaled as shard 0) or a target logit taken from the wrong shard would
// move the loss or the softmax far past the tolerances above; check that the test data can tell.
TEST(VocabParallel, ShardsSeeDifferentMaxima) {
  const FVec h = random_vec(kN * kD, 31, 2.0f), w = random_vec(kVocab * kD, 32);
  const std::vector<int32_t> targets = token_ids(7);
  FVec probs(kN * kVocab / 2), stats(2 * kN * kVocabStats);
  for (int s = 0; s < 2; ++s) {
    const FVec ws = rows_of(w, s * kVocab / 2, kVocab / 2, kD);
    lm_head_shard_forward(probs.data(), stats.data() + s * kN * kVocabStats, h.data(), ws.data(), targets.data(), kN,
                          kD, s * kVocab / 2, kVocab / 2);
  }
  int differ = 0, owned = 0;
  for (int64_t i = 0; i < kN; ++i) {
    differ += std::abs(stats[i * kVocabStats] - stats[(kN + i) * kVocabStats]) > 0.1f;
    owned += (stats[i * kVocabStats + 2] != 0) + (stats[(kN + i) * kVocabStats + 2] != 0);
  }
  EXPECT_GT(differ, kN / 2) << "the two shards' maxima differ for most tokens";
  EXPECT_EQ(owned, kN) << "exactly one shard holds each target's logit";
}

TEST(VocabParallel, EmbeddingShardsSumToTheWholeLookup) {
  const FVec table = random_vec(kVocab * kD, 41), dout = random_vec(kN * kD, 42);
  const std::vector<int32_t> ids = token_ids(5);  // repeated ids: their gradients add up
  FVec want(kN * kD), dwant(kVocab * kD, 0.0f);
  embedding_forward(want.data(), ids.data(), table.data(), kN, kVocab, kD);
  ref::embedding_backward_weight(dwant.data(), dout.data(), ids.data(), kN, kVocab, kD);
  for (int shards : {1, 2, 3, 4}) {
    const int64_t rows = kVocab / shards;
    FVec sum(kN * kD, 0.0f);
    for (int s = 0; s < shards; ++s) {
      const FVec ts = rows_of(table, s * rows, rows, kD);
      FVec out(kN * kD, -1.0f), dtable(rows * kD, 0.0f);
      embedding_shard_forward(out.data(), ids.data(), ts.data(), kN, s * rows, rows, kD);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
      embedding_shard_backward_weight(dtable.data(), dout.data(), ids.data(), kN, s * rows, rows, kD);
      EXPECT_EQ(dtable, rows_of(dwant, s * rows, rows, kD)) << shards << " shards: rows of shard " << s;
    }
    EXPECT_EQ(sum, want) << shards << " shards: the other shards write zeros";
  }
}

TEST(VocabParallel, SameBitsForOneAndTwoThreads) {
  const FVec h = random_vec(kN * kD, 31, 2.0f), w = random_vec(kVocab * kD, 32);
  const std::vector<int32_t> targets = token_ids(7);
  set_kernel_threads(1);
  const std::vector<Head> one = sharded_head(h, w, targets, 3);
  set_kernel_threads(2);
  const std::vector<Head> two = sharded_head(h, w, targets, 3);
  for (size_t s = 0; s < one.size(); ++s) {
    EXPECT_EQ(one[s].loss, two[s].loss);
    EXPECT_EQ(one[s].probs, two[s].probs);
    EXPECT_EQ(one[s].dh, two[s].dh);
    EXPECT_EQ(one[s].dw, two[s].dw);
  }
}

}  // namespace
}  // namespace piper::kernels
