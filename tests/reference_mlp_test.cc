// The float64 reference itself (tests/reference_mlp.h), on inputs whose
// answers are known by hand: what the backend tests compare against must
// be right, and its checks must be able to fail.
#include "tests/reference_mlp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

TEST(ReferenceMlpTest, ZeroWeightsGiveLogOfTheClassCountAndNoActiveUnit) {
  const ModelLayout layout = ModelLayout::Mlp({4, 3, 5});
  const std::vector<double> zeros(layout.num_params(), 0.0);
  const MlpBatch batch = RandomMlpBatch(layout, 3, 1);
  const Reference ref = RefForward(layout, zeros, batch);
  EXPECT_NEAR(ref.loss, std::log(5.0), 1e-15);
  ASSERT_EQ(ref.losses.size(), 3u);
  ASSERT_EQ(ref.logits.size(), 3u * 5);
  for (double z : ref.logits) EXPECT_EQ(z, 0.0);
  EXPECT_EQ(ref.active, std::vector<char>(3 * 3, 0));
  EXPECT_EQ(ForwardSample(layout, zeros, absl::MakeConstSpan(batch.x).first(4))
                .min_abs_preactivation,
            0.0);
}

// Softmax regression, 2 inputs and 2 classes: dL/dW[o][i] = (p_o - y_o) x_i
// and dL/db[o] = p_o - y_o, with p the softmax of the logits.
TEST(ReferenceMlpTest, CentralDifferencesMatchTheDerivativeByHand) {
  const ModelLayout layout = ModelLayout::Mlp({2, 2});
  const std::vector<double> p = {0.5, -1.0, 2.0, 0.25, 0.1, -0.3};  // W, b
  MlpBatch batch;
  batch.x = {1.5f, -2.0f};
  batch.labels = {1};
  const double z0 = 0.5 * 1.5 - 1.0 * -2.0 + 0.1;
  const double z1 = 2.0 * 1.5 + 0.25 * -2.0 - 0.3;
  const double p0 = 1.0 / (1.0 + std::exp(z1 - z0));
  const double d[2] = {p0, (1.0 - p0) - 1.0};  // p - onehot(1)
  const std::vector<double> want = {d[0] * 1.5,  d[0] * -2.0, d[1] * 1.5,
                                    d[1] * -2.0, d[0],        d[1]};
  const std::vector<std::optional<double>> got =
      CentralDifferences(layout, p, batch, {0, 1, 2, 3, 4, 5}, 1e-5);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_TRUE(got[k].has_value()) << ParamName(layout, k);
    EXPECT_NEAR(*got[k], want[k], 1e-8) << ParamName(layout, k);
  }
  EXPECT_EQ(ParamName(layout, 4), "fc1.bias[0]");
}

// One hidden unit whose input is exactly 0: +-h on its weight turns it on
// and off, so no difference quotient is given there; the output layer's
// parameters are no kink.
TEST(ReferenceMlpTest, AKinkIsReportedInsteadOfDifferenced) {
  const ModelLayout layout = ModelLayout::Mlp({1, 1, 2});
  // w1, b1 (pre-activation 0 for any x), w2 (2x1), b2.
  const std::vector<double> p = {0.0, 0.0, 1.0, -1.0, 0.5, 0.0};
  MlpBatch batch;
  batch.x = {1.0f};
  batch.labels = {0};
  const std::vector<std::optional<double>> got =
      CentralDifferences(layout, p, batch, {0, 1, 4, 5}, 1e-4);
  EXPECT_FALSE(got[0].has_value()) << "w1 at a kink";
  EXPECT_FALSE(got[1].has_value()) << "b1 at a kink";
  EXPECT_TRUE(got[2].has_value());
  EXPECT_TRUE(got[3].has_value());
}

TEST(ReferenceMlpTest, BatchesFarFromKinksKeepTheirMargin) {
  const ModelLayout layout = ModelLayout::Mlp({6, 8, 4});
  const std::vector<float> params = InitParams(layout, 5);
  const double margin = 0.05;  // wide: many samples are redrawn
  const MlpBatch batch = MlpBatchFarFromKinks(layout, params, 50, 6, margin);
  ASSERT_EQ(batch.labels.size(), 50u);
  const std::vector<double> p = ToDouble(params);
  int redrawn = 0;
  const MlpBatch plain = RandomMlpBatch(layout, 50, 6);
  for (int s = 0; s < 50; ++s) {
    const SampleForward f = ForwardSample(
        layout, p, absl::MakeConstSpan(batch.x).subspan(s * 6, 6));
    EXPECT_GE(f.min_abs_preactivation, margin) << "sample " << s;
    std::vector<double> z = f.logits;
    std::sort(z.begin(), z.end());
    EXPECT_GE(z[3] - z[2], margin) << "sample " << s;
    EXPECT_GE(batch.labels[s], 0);
    EXPECT_LT(batch.labels[s], 4);
    redrawn += !std::equal(batch.x.begin() + s * 6, batch.x.begin() + s * 6 + 6,
                           plain.x.begin() + s * 6);
  }
  EXPECT_GT(redrawn, 0) << "the margin was never in the way: no test";
}

TEST(ReferenceMlpTest, ComparisonCountsEveryMismatchAndNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> got = {1.0, 2.0000001, nan, 4.1, -3.0};
  const std::vector<double> want = {1.0, 2.0, 3.0, 4.0, -3.0003};
  const Comparison c = CompareWithTolerance(
      got, want, 1e-6, 1e-4, [](size_t i) { return std::to_string(i); }, "got",
      "want");
  EXPECT_EQ(c.mismatches, 2);  // the NaN and 4.1; -3.0 is within rtol
  EXPECT_TRUE(std::isnan(c.max_abs));
  const Comparison exact = CompareWithTolerance(
      {1.0, 2.0}, {1.0, 2.0}, 0.0, 0.0, [](size_t) { return ""; }, "a", "b");
  EXPECT_EQ(exact.mismatches, 0);
  EXPECT_EQ(exact.diff_l2, 0.0);
  EXPECT_EQ(exact.ref_l2, 5.0);
}

}  // namespace
}  // namespace dp
