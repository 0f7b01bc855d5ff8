// The float64 definition of an MLP of any ModelLayout, for the tests that
// check a backend against it: forward, loss, gradients by central
// differences, and test batches drawn away from the ReLU kinks.
//
// The model: h = relu(W h + b) for hidden layers, logits = W h + b for the
// last, loss = mean over samples of logsumexp(logits) - logits[label].
#ifndef DP_TESTS_REFERENCE_MLP_H_
#define DP_TESTS_REFERENCE_MLP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/model_layout.h"

namespace dp {

struct MlpBatch {
  std::vector<float> x;         // (n, input_dim)
  std::vector<int32_t> labels;  // (n)
};

std::vector<double> ToDouble(absl::Span<const float> v);

// One sample through the float64 model.
struct SampleForward {
  std::vector<double> logits;  // (C)
  std::vector<char> active;    // every hidden pre-activation > 0, in order
  // The smallest |hidden pre-activation|; +inf without hidden layers.
  double min_abs_preactivation;
};
// x is (input_dim), params (num_params).
SampleForward ForwardSample(const ModelLayout& layout,
                            absl::Span<const double> params,
                            absl::Span<const float> x);

// logsumexp(logits) - logits[label], with the max shifted out.
double CrossEntropy(absl::Span<const double> logits, int label);

// A whole batch through the float64 model.
struct Reference {
  double loss = 0.0;           // mean over the batch
  std::vector<double> losses;  // (n) per sample
  std::vector<double> logits;  // (n, C)
  std::vector<char> active;    // every hidden pre-activation > 0, in order
};
Reference RefForward(const ModelLayout& layout, absl::Span<const double> params,
                     const MlpBatch& batch);

// d loss / d params[k] for each k of `which`, by float64 central
// differences with step h; nullopt where the +-h perturbation flips a ReLU
// (a kink, where the difference quotient is not the derivative).
std::vector<std::optional<double>> CentralDifferences(
    const ModelLayout& layout, std::vector<double> params,
    const MlpBatch& batch, const std::vector<int64_t>& which, double h);

// "fc2.weight[17]": parameter k by its tensor and index there.
std::string ParamName(const ModelLayout& layout, int64_t k);

// Values against a reference with a mixed tolerance, llm.c style: entry i
// passes when |got - want| <= atol + rtol * |want| (NaN never passes).
struct Comparison {
  int64_t mismatches = 0;
  double max_abs = 0.0;  // the largest |got - want| (NaN if any is)
  double diff_l2 = 0.0;  // sum of squared differences
  double ref_l2 = 0.0;   // sum of squared reference values
};
// Prints the first 10 mismatches, each as "mismatch NAME: GOT_LABEL value
// WANT_LABEL value |diff| d > tolerance", name(i) naming entry i.
Comparison CompareWithTolerance(absl::Span<const double> got,
                                absl::Span<const double> want, double atol,
                                double rtol,
                                const std::function<std::string(size_t)>& name,
                                const char* got_label, const char* want_label);

// n samples of N(0,1) features and uniform labels, from (seed, stream 11).
MlpBatch RandomMlpBatch(const ModelLayout& layout, int n, uint64_t seed);

// The same, each sample redrawn until, in float64 with `params`, no ReLU
// input lies within `margin` of 0 and the two largest logits lie at least
// `margin` apart: float32 rounding cannot then decide a branch or an
// argmax differently on two backends. Aborts, naming the batch, when 1000
// draws of one sample all fail (weights that put every sample on a kink).
MlpBatch MlpBatchFarFromKinks(const ModelLayout& layout,
                              const std::vector<float>& params, int n,
                              uint64_t seed, double margin);

}  // namespace dp

#endif  // DP_TESTS_REFERENCE_MLP_H_
