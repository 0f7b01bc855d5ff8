// Rank-ordered gradient averaging fused with the Adam update.
#include "server/adam.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace dp {
namespace {

// Elements per block: the summed gradient of a block stays in L1 between
// the averaging pass and the update pass, so each buffer is streamed once.
constexpr int64_t kBlock = 512;

struct Coefficients {
  float one_minus_beta1, beta2, one_minus_beta2, wd, eps, neg_step_size,
      bc2_sqrt, count;
};

// g (n) holds the rank-ordered sum of the gradients on entry.
void UpdateBlock(const Coefficients& c, int64_t n, float* __restrict g,
                 float* __restrict p, float* __restrict m,
                 float* __restrict v) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] / c.count;
    gi += c.wd * p[i];  // wd is 0 by default, and 0 * p adds +-0: exact
    m[i] += c.one_minus_beta1 * (gi - m[i]);  // torch's lerp, weight < 0.5
    v[i] = v[i] * c.beta2 + c.one_minus_beta2 * (gi * gi);
    // torch divides sqrt(v) by sqrt(bc2) before adding eps; keep that order.
    const float denom = std::sqrt(v[i]) / c.bc2_sqrt + c.eps;
    p[i] += c.neg_step_size * (m[i] / denom);
  }
}

}  // namespace

int64_t FirstOutOfRangeGradient(const float* x, int64_t n) {
  // A branch-free OR-reduction that vectorises; only when it fires do we look
  // for the position. !(|x| <= max) is also true for NaN.
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    any |= static_cast<uint32_t>(!(std::fabs(x[i]) <= kMaxAbsGradient));
  }
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!(std::fabs(x[i]) <= kMaxAbsGradient)) return i;
  }
  return -1;
}

void AverageAndAdamStep(const AdamOptions& o, int64_t t,
                        absl::Span<const float* const> grads, int64_t n,
                        float* params, float* m, float* v) {
  DP_CHECK(t >= 1 && !grads.empty());
  // Bias corrections in double, as torch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  const Coefficients c{static_cast<float>(1.0 - o.beta1),
                       static_cast<float>(o.beta2),
                       static_cast<float>(1.0 - o.beta2),
                       static_cast<float>(o.weight_decay),
                       static_cast<float>(o.eps),
                       static_cast<float>(-(o.lr / bc1)),
                       static_cast<float>(std::sqrt(bc2)),
                       static_cast<float>(grads.size())};
  alignas(64) float g[kBlock];
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t len = std::min(kBlock, n - begin);
    const float* __restrict g0 = grads[0] + begin;
    for (int64_t i = 0; i < len; ++i) g[i] = g0[i];
    for (size_t r = 1; r < grads.size(); ++r) {  // rank order
      const float* __restrict gr = grads[r] + begin;
      for (int64_t i = 0; i < len; ++i) g[i] += gr[i];
    }
    UpdateBlock(c, len, g, params + begin, m + begin, v + begin);
  }
}

}  // namespace dp
