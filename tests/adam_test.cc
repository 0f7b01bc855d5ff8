// Adam against values worked out independently of server/adam.cc.
#include "server/adam.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

// With a constant gradient g, Adam's bias-corrected moments are exactly g and
// g^2 at every step, so each step moves p by -lr * g / (|g| + eps).
TEST(AdamTest, ConstantGradientMovesByLrPerStepInClosedForm) {
  const std::vector<float> g = {0.5f, -0.25f, 2.0f, -1e-3f, 0.0f};
  const std::vector<float> p0 = {0.1f, -0.2f, 0.3f, 0.0f, 0.05f};
  std::vector<float> p = p0, m(g.size(), 0.0f), v(g.size(), 0.0f);
  AdamOptions o;
  const float* grads[] = {g.data()};
  for (int t = 1; t <= 3; ++t) {
    AverageAndAdamStep(o, t, grads, g.size(), p.data(), m.data(), v.data());
  }
  for (size_t i = 0; i < g.size(); ++i) {
    const double expected =
        p0[i] - 3 * o.lr * g[i] / (std::fabs(g[i]) + o.eps);
    EXPECT_NEAR(p[i], expected, 1e-7) << "element " << i;
  }
}

// Textbook Adam (Kingma & Ba, with torch's eps placement) in double.
struct ReferenceAdam {
  std::vector<double> p, m, v;
  void Step(const AdamOptions& o, int t, const std::vector<double>& g) {
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(o.beta1, t));
      const double denom =
          std::sqrt(v[i]) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
      p[i] -= o.lr * mhat / denom;
    }
  }
};

TEST(AdamTest, ThreeStepsOfAveragedGradientsMatchDoubleReference) {
  // Integer-valued gradients: their averages are exact in float.
  const std::vector<std::vector<float>> steps_rank0 = {
      {1, -2, 3, 0}, {4, 4, -1, 2}, {-3, 1, 1, -5}};
  const std::vector<std::vector<float>> steps_rank1 = {
      {3, 2, -1, 2}, {-2, 0, 5, 2}, {1, 1, -3, 1}};
  std::vector<float> p = {0.5f, -0.5f, 0.25f, 0.0f};
  std::vector<float> m(4, 0.0f), v(4, 0.0f);
  ReferenceAdam ref{{0.5, -0.5, 0.25, 0.0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  AdamOptions o;
  o.lr = 0.01;
  for (int t = 1; t <= 3; ++t) {
    const float* grads[] = {steps_rank0[t - 1].data(), steps_rank1[t - 1].data()};
    AverageAndAdamStep(o, t, grads, 4, p.data(), m.data(), v.data());
    std::vector<double> avg(4);
    for (int i = 0; i < 4; ++i) {
      avg[i] = (steps_rank0[t - 1][i] + steps_rank1[t - 1][i]) / 2.0;
    }
    ref.Step(o, t, avg);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(p[i], ref.p[i], 1e-7) << "step " << t << " element " << i;
      EXPECT_NEAR(m[i], ref.m[i], 1e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(v[i], ref.v[i], 1e-6) << "step " << t << " element " << i;
    }
  }
}

TEST(AdamTest, WeightDecayAddsDecayTimesParamToTheGradient) {
  std::vector<float> p = {1.0f}, m = {0.0f}, v = {0.0f};
  const std::vector<float> g = {0.0f};
  AdamOptions o;
  o.weight_decay = 0.5;
  const float* grads[] = {g.data()};
  AverageAndAdamStep(o, 1, grads, 1, p.data(), m.data(), v.data());
  // Effective gradient 0.5 > 0: the first step moves by -lr.
  EXPECT_NEAR(p[0], 1.0 - o.lr, 1e-7);
}

}  // namespace
}  // namespace dp
