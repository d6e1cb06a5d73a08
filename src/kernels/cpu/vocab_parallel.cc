// Vocabulary-parallel embedding and LM head + cross-entropy (ops.h, "Vocabulary parallelism").
#include <algorithm>
#include <cmath>
#include <vector>

#include "piper/base/check.h"
#include "piper/kernels/cpu/ops.h"
#include "piper/kernels/cpu/vec_math.h"

namespace piper::kernels {

void embedding_shard_forward(float* out, const int32_t* ids, const float* table, int64_t n, int64_t begin, int64_t rows,
                             int64_t d) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = static_cast<int64_t>(ids[i]) - begin;
    float* o = out + i * d;
    if (r < 0 || r >= rows) {
      std::fill(o, o + d, 0.0f);
    } else {
      std::copy(table + r * d, table + (r + 1) * d, o);
    }
  }
}

void embedding_shard_backward_weight(float* dtable, const float* dout, const int32_t* ids, int64_t n, int64_t begin,
                                     int64_t rows, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {  // token order, as the reference: a row's updates add up in one order
    const int64_t r = static_cast<int64_t>(ids[i]) - begin;
    if (r < 0 || r >= rows) continue;
    for (int64_t j = 0; j < d; ++j) dtable[r * d + j] += dout[i * d + j];
  }
}

void lm_head_shard_forward(float* probs, float* stats, const float* h, const float* w, const int32_t* targets,
                           int64_t n, int64_t d, int64_t begin, int64_t rows) {
  PIPER_CHECK(rows >= 1);
  linear_forward(probs, h, w, n, d, rows);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float* p = probs + i * rows;
    const int64_t t = static_cast<int64_t>(targets[i]) - begin;
    const float logit_t = t >= 0 && t < rows ? p[t] : 0.0f;
    const vec::SoftmaxStats st = vec::softmax_inplace(p, rows, /*reciprocal=*/false);
    float* s = stats + i * kVocabStats;
    s[0] = st.max;
    s[1] = st.sum;
    s[2] = logit_t;
  }
}

void lm_head_shard_loss(float* loss, float* probs, const float* all_stats, int shards, int shard, int64_t n,
                        int64_t rows) {
  PIPER_CHECK(shards >= 1 && shard >= 0 && shard < shards);
  std::vector<double> row_loss(static_cast<size_t>(n));
  const int64_t stride = n * kVocabStats;  // one shard's stats
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float* s = all_stats + i * kVocabStats;
    float mx = s[0];
    for (int k = 1; k < shards; ++k) mx = std::max(mx, s[k * stride]);
    // The sum of exp(logit - max) over the whole vocabulary and the target's logit (one shard holds it, the others
    // add 0), in shard order. With one shard: sum = its sum, scale = 1, as the whole-vocabulary kernel.
    float sum = 0, logit_t = 0, mine = 0;
    for (int k = 0; k < shards; ++k) {
      const float part = s[k * stride + 1] * std::exp(s[k * stride] - mx);
      sum += part;
      logit_t += s[k * stride + 2];
      if (k == shard) mine = part;
    }
    const float scale = mine / sum;
    float* p = probs + i * rows;
    for (int64_t c = 0; c < rows; ++c) p[c] *= scale;
    row_loss[static_cast<size_t>(i)] = static_cast<double>(std::log(sum)) - static_cast<double>(logit_t - mx);
  }
  double total = 0;
  for (double l : row_loss) total += l;  // token order, as lm_head_loss_forward
  *loss = static_cast<float>(n > 0 ? total / static_cast<double>(n) : 0.0);
}

void lm_head_shard_backward_input(float* dh, float* dlogits, const float* probs, const int32_t* targets, const float* w,
                                  float dloss, int64_t n, int64_t d, int64_t begin, int64_t rows) {
  const float scale = n > 0 ? dloss / static_cast<float>(n) : 0.0f;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < rows; ++c) dlogits[i * rows + c] = probs[i * rows + c] * scale;
    const int64_t t = static_cast<int64_t>(targets[i]) - begin;
    if (t >= 0 && t < rows) dlogits[i * rows + t] -= scale;
  }
  linear_backward_input(dh, dlogits, w, n, d, rows);
}

}  // namespace piper::kernels
