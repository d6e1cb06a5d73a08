// Pieces shared by the closed form's translation units (estimate.cc, estimate_af.cc); not part of the API.
#pragma once

namespace piper::cost {

// F, B, W times of one thing (a layer part, a layer, a rank's microbatch).
struct Fbw {
  double f = 0, b = 0, w = 0;
  Fbw& operator+=(const Fbw& o) {
    f += o.f;
    b += o.b;
    w += o.w;
    return *this;
  }
  Fbw operator*(double k) const { return {f * k, b * k, w * k}; }
  Fbw operator+(const Fbw& o) const { return {f + o.f, b + o.b, w + o.w}; }
  double total() const { return f + b + w; }
};

}  // namespace piper::cost
