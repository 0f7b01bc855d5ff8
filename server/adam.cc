// Rank-ordered gradient averaging fused with the Adam update.
#include "server/adam.h"

#include <cmath>

#include "common/status_macros.h"

namespace dp {

void AverageAndAdamStep(const AdamOptions& o, int64_t t,
                        absl::Span<const float* const> grads, int64_t n,
                        float* params, float* m, float* v) {
  DP_CHECK(t >= 1 && !grads.empty());
  // Bias corrections in double, as torch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  const float one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  const float beta2 = static_cast<float>(o.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  const float wd = static_cast<float>(o.weight_decay);
  const float eps = static_cast<float>(o.eps);
  const float neg_step_size = static_cast<float>(-(o.lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float count = static_cast<float>(grads.size());
  const size_t k = grads.size();
  for (int64_t i = 0; i < n; ++i) {
    float g = grads[0][i];
    for (size_t r = 1; r < k; ++r) g += grads[r][i];
    if (k > 1) g /= count;
    if (wd != 0.0f) g += wd * params[i];
    m[i] += one_minus_beta1 * (g - m[i]);  // torch's lerp for weight < 0.5
    v[i] = v[i] * beta2 + one_minus_beta2 * (g * g);
    // torch divides sqrt(v) by sqrt(bc2) before adding eps; keep that order.
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    params[i] += neg_step_size * (m[i] / denom);
  }
}

}  // namespace dp
