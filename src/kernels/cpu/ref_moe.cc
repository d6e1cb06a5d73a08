// Reference MoE kernels: router, permutation, grouped expert GEMMs.
#include <cmath>
#include <vector>

#include "piper/base/check.h"
#include "piper/kernels/cpu/moe_reference.h"

namespace piper::kernels {

Routing build_routing(const int32_t* topk_idx, int64_t n, int top_k, int num_experts) {
  Routing r;
  r.num_experts = num_experts;
  r.top_k = top_k;
  r.num_tokens = n;
  r.expert_offsets.assign(num_experts + 1, 0);
  const int64_t rows = n * top_k;
  for (int64_t s = 0; s < rows; ++s) {
    PIPER_CHECK(topk_idx[s] >= 0 && topk_idx[s] < num_experts, "expert index ", topk_idx[s], " of ", num_experts);
    ++r.expert_offsets[topk_idx[s] + 1];
  }
  for (int e = 0; e < num_experts; ++e) r.expert_offsets[e + 1] += r.expert_offsets[e];
  std::vector<int64_t> next(r.expert_offsets.begin(), r.expert_offsets.end() - 1);
  r.row_of_slot.resize(rows);
  r.token_of_row.resize(rows);
  for (int64_t s = 0; s < rows; ++s) {
    const int64_t row = next[topk_idx[s]]++;
    r.row_of_slot[s] = row;
    r.token_of_row[row] = s / top_k;
  }
  return r;
}

void router_update_bias(float* bias, const int64_t* expert_counts, int num_experts, double rate) {
  double total = 0;
  for (int e = 0; e < num_experts; ++e) total += static_cast<double>(expert_counts[e]);
  const double mean = total / num_experts;
  for (int e = 0; e < num_experts; ++e) {
    const double c = static_cast<double>(expert_counts[e]);
    const double sign = c < mean ? 1.0 : (c > mean ? -1.0 : 0.0);
    bias[e] += static_cast<float>(rate * sign);
  }
}

namespace ref {

template <typename T>
void router_forward(T* scores, int32_t* topk_idx, T* topk_w, T* aux_loss, const T* x, const T* wr, const float* bias,
                    int64_t n, int64_t d, const RouterConfig& cfg) {
  linear_forward(scores, x, wr, n, d, cfg.num_experts);
  router_select(scores, topk_idx, topk_w, aux_loss, bias, n, cfg);
}

template <typename T>
void router_select(T* scores, int32_t* topk_idx, T* topk_w, T* aux_loss, const float* bias, int64_t n,
                   const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  PIPER_CHECK(K >= 1 && K <= E, "top_k ", K, " num_experts ", E);
  std::vector<int64_t> counts(E, 0);
  std::vector<bool> taken(E);
  for (int64_t t = 0; t < n; ++t) {
    T* s = scores + t * E;
    if (cfg.score == ScoreFunc::kSoftmax) {
      T mx = s[0];
      for (int e = 1; e < E; ++e) mx = std::max(mx, s[e]);
      T sum = 0;
      for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(s[e] - mx));
      for (int e = 0; e < E; ++e) s[e] /= sum;
    } else {
      for (int e = 0; e < E; ++e) s[e] = T(1) / (T(1) + std::exp(-s[e]));
    }
    std::fill(taken.begin(), taken.end(), false);
    T wsum = 0;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      T best_v = 0;
      for (int e = 0; e < E; ++e) {
        if (taken[e]) continue;
        const T v = s[e] + (bias ? static_cast<T>(bias[e]) : T(0));
        if (best < 0 || v > best_v) best = e, best_v = v;  // strict: ties keep the lower index
      }
      taken[best] = true;
      topk_idx[t * K + j] = best;
      topk_w[t * K + j] = s[best];
      wsum += s[best];
      ++counts[best];
    }
    if (cfg.norm_topk) {
      for (int j = 0; j < K; ++j) topk_w[t * K + j] /= wsum;
    }
  }
  T aux = 0;
  if (cfg.aux_loss_coef > 0) {
    for (int e = 0; e < E; ++e) {
      T p = 0;
      for (int64_t t = 0; t < n; ++t) p += scores[t * E + e];
      aux += static_cast<T>(counts[e]) / static_cast<T>(n * K) * (p / static_cast<T>(n));
    }
    aux *= static_cast<T>(cfg.aux_loss_coef * E);
  }
  *aux_loss = aux;
}

template <typename T>
void router_backward_input(T* dx, T* dlogits, const T* dtopk_w, const T* scores, const int32_t* topk_idx,
                           const T* topk_w, const T* wr, int64_t n, int64_t d, const RouterConfig& cfg) {
  router_dlogits(dlogits, dtopk_w, scores, topk_idx, topk_w, n, cfg);
  linear_backward_input(dx, dlogits, wr, n, d, cfg.num_experts);
}

template <typename T>
void router_dlogits(T* dlogits, const T* dtopk_w, const T* scores, const int32_t* topk_idx, const T* topk_w, int64_t n,
                    const RouterConfig& cfg) {
  const int E = cfg.num_experts, K = cfg.top_k;
  std::vector<int64_t> counts(E, 0);
  for (int64_t s = 0; s < n * K; ++s) ++counts[topk_idx[s]];
  std::vector<T> ds(E);
  for (int64_t t = 0; t < n; ++t) {
    const T* s = scores + t * E;
    for (int e = 0; e < E; ++e) {
      const T count = cfg.aux_counts ? static_cast<T>(cfg.aux_counts[e]) : static_cast<T>(counts[e]);
      const int64_t tokens = cfg.aux_counts ? cfg.aux_tokens : n;
      ds[e] = cfg.aux_loss_coef > 0 ? static_cast<T>(cfg.aux_loss_coef * E) * count / static_cast<T>(tokens * K) /
                                          static_cast<T>(tokens)
                                    : T(0);
    }
    if (cfg.norm_topk) {
      // w_j = s_j / S with S = sum of selected scores: ds_m = (dw_m - sum_j dw_j w_j) / S.
      T sel_sum = 0, dot = 0;
      for (int j = 0; j < K; ++j) {
        sel_sum += s[topk_idx[t * K + j]];
        dot += dtopk_w[t * K + j] * topk_w[t * K + j];
      }
      for (int j = 0; j < K; ++j) ds[topk_idx[t * K + j]] += (dtopk_w[t * K + j] - dot) / sel_sum;
    } else {
      for (int j = 0; j < K; ++j) ds[topk_idx[t * K + j]] += dtopk_w[t * K + j];
    }
    T* dl = dlogits + t * E;
    if (cfg.score == ScoreFunc::kSoftmax) {
      T sds = 0;
      for (int e = 0; e < E; ++e) sds += s[e] * ds[e];
      for (int e = 0; e < E; ++e) dl[e] = s[e] * (ds[e] - sds);
    } else {
      for (int e = 0; e < E; ++e) dl[e] = ds[e] * s[e] * (T(1) - s[e]);
    }
  }
}

template <typename T>
void router_backward_weight(T* dwr, const T* dlogits, const T* x, int64_t n, int64_t d, const RouterConfig& cfg) {
  linear_backward_weight(dwr, dlogits, x, n, d, cfg.num_experts);
}

template <typename T>
void permute_forward(T* xp, const T* x, const Routing& r, int64_t d) {
  const int64_t rows = r.num_tokens * r.top_k;
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t c = 0; c < d; ++c) xp[row * d + c] = x[r.token_of_row[row] * d + c];
  }
}

template <typename T>
void permute_backward_input(T* dx, const T* dxp, const Routing& r, int64_t d) {
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    for (int64_t c = 0; c < d; ++c) dx[t * d + c] = 0;
    for (int j = 0; j < r.top_k; ++j) {
      const int64_t row = r.row_of_slot[t * r.top_k + j];
      for (int64_t c = 0; c < d; ++c) dx[t * d + c] += dxp[row * d + c];
    }
  }
}

template <typename T>
void unpermute_forward(T* y, const T* yp, const T* topk_w, const Routing& r, int64_t d) {
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    for (int64_t c = 0; c < d; ++c) y[t * d + c] = 0;
    for (int j = 0; j < r.top_k; ++j) {
      const int64_t row = r.row_of_slot[t * r.top_k + j];
      const T w = topk_w[t * r.top_k + j];
      for (int64_t c = 0; c < d; ++c) y[t * d + c] += w * yp[row * d + c];
    }
  }
}

template <typename T>
void unpermute_backward_input(T* dyp, T* dtopk_w, const T* dy, const T* yp, const T* topk_w, const Routing& r,
                              int64_t d) {
  for (int64_t t = 0; t < r.num_tokens; ++t) {
    for (int j = 0; j < r.top_k; ++j) {
      const int64_t row = r.row_of_slot[t * r.top_k + j];
      const T w = topk_w[t * r.top_k + j];
      T dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        dyp[row * d + c] = w * dy[t * d + c];
        dot += dy[t * d + c] * yp[row * d + c];
      }
      dtopk_w[t * r.top_k + j] = dot;
    }
  }
}

template <typename T>
void grouped_linear_forward(T* y, const T* x, const T* w, const Routing& r, int64_t in, int64_t out) {
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    linear_forward(y + off * out, x + off * in, w + e * out * in, r.count(e), in, out);
  }
}

template <typename T>
void grouped_linear_backward_input(T* dx, const T* dy, const T* w, const Routing& r, int64_t in, int64_t out) {
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    linear_backward_input(dx + off * in, dy + off * out, w + e * out * in, r.count(e), in, out);
  }
}

template <typename T>
void grouped_linear_backward_weight(T* dw, const T* dy, const T* x, const Routing& r, int64_t in, int64_t out) {
  for (int e = 0; e < r.num_experts; ++e) {
    if (r.count(e) == 0) continue;
    const int64_t off = r.expert_offsets[e];
    linear_backward_weight(dw + e * out * in, dy + off * out, x + off * in, r.count(e), in, out);
  }
}

template <typename T>
void expert_swiglu_forward(T* yp, T* g, T* u, T* h, const T* xp, const T* wg, const T* wu, const T* wd,
                           const Routing& r, int64_t d, int64_t f) {
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    swiglu_forward(yp + off * d, g + off * f, u + off * f, h + off * f, xp + off * d, wg + e * f * d, wu + e * f * d,
                   wd + e * d * f, r.count(e), d, f);
  }
}

template <typename T>
void expert_swiglu_backward_input(T* dxp, T* dg, T* du, const T* dyp, const T* g, const T* u, const T* wg, const T* wu,
                                  const T* wd, const Routing& r, int64_t d, int64_t f) {
  for (int e = 0; e < r.num_experts; ++e) {
    const int64_t off = r.expert_offsets[e];
    swiglu_backward_input(dxp + off * d, dg + off * f, du + off * f, dyp + off * d, g + off * f, u + off * f,
                          wg + e * f * d, wu + e * f * d, wd + e * d * f, r.count(e), d, f);
  }
}

template <typename T>
void expert_swiglu_backward_weight(T* dwg, T* dwu, T* dwd, const T* dyp, const T* xp, const T* h, const T* dg,
                                   const T* du, const Routing& r, int64_t d, int64_t f) {
  for (int e = 0; e < r.num_experts; ++e) {
    if (r.count(e) == 0) continue;
    const int64_t off = r.expert_offsets[e];
    swiglu_backward_weight(dwg + e * f * d, dwu + e * f * d, dwd + e * d * f, dyp + off * d, xp + off * d, h + off * f,
                           dg + off * f, du + off * f, r.count(e), d, f);
  }
}

#define PIPER_INSTANTIATE_MOE(T)                                                                                   \
  template void router_forward<T>(T*, int32_t*, T*, T*, const T*, const T*, const float*, int64_t, int64_t,        \
                                  const RouterConfig&);                                                            \
  template void router_backward_input<T>(T*, T*, const T*, const T*, const int32_t*, const T*, const T*, int64_t,  \
                                         int64_t, const RouterConfig&);                                            \
  template void router_backward_weight<T>(T*, const T*, const T*, int64_t, int64_t, const RouterConfig&);          \
  template void router_select<T>(T*, int32_t*, T*, T*, const float*, int64_t, const RouterConfig&);                \
  template void router_dlogits<T>(T*, const T*, const T*, const int32_t*, const T*, int64_t, const RouterConfig&); \
  template void permute_forward<T>(T*, const T*, const Routing&, int64_t);                                         \
  template void permute_backward_input<T>(T*, const T*, const Routing&, int64_t);                                  \
  template void unpermute_forward<T>(T*, const T*, const T*, const Routing&, int64_t);                             \
  template void unpermute_backward_input<T>(T*, T*, const T*, const T*, const T*, const Routing&, int64_t);        \
  template void grouped_linear_forward<T>(T*, const T*, const T*, const Routing&, int64_t, int64_t);               \
  template void grouped_linear_backward_input<T>(T*, const T*, const T*, const Routing&, int64_t, int64_t);        \
  template void grouped_linear_backward_weight<T>(T*, const T*, const T*, const Routing&, int64_t, int64_t);       \
  template void expert_swiglu_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, const Routing&,   \
                                         int64_t, int64_t);                                                        \
  template void expert_swiglu_backward_input<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,      \
                                                const T*, const Routing&, int64_t, int64_t);                       \
  template void expert_swiglu_backward_weight<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,     \
                                                 const Routing&, int64_t, int64_t);

PIPER_INSTANTIATE_MOE(float)
PIPER_INSTANTIATE_MOE(double)

}  // namespace ref
}  // namespace piper::kernels
