// The benchmark backend without arithmetic (see null_backend.h).
#include "worker/null_backend.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dp {

NullBackend::NullBackend(const ModelLayout& layout,
                         const BackendOptions& options)
    : layout_(layout), max_batch_(options.max_batch) {}

absl::Status NullBackend::SetWeights(absl::Span<const float> params) {
  if (static_cast<int64_t>(params.size()) != layout_.num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetWeights: ", params.size(), " floats, expected ",
                     layout_.num_params()));
  }
  weights_set_ = true;
  return absl::OkStatus();
}

absl::Status NullBackend::TakeWeights(std::vector<float>* params) {
  return SetWeights(*params);
}

absl::Status NullBackend::ViewWeights(
    absl::Span<const absl::Span<const float>> tensors) {
  RETURN_IF_ERROR(CheckTensorViews(layout_, tensors));
  weights_set_ = true;
  return absl::OkStatus();
}

absl::StatusOr<float> NullBackend::ForwardBackward(
    absl::Span<const float> x, absl::Span<const int32_t> labels,
    absl::Span<float> grad) {
  RETURN_IF_ERROR(CheckBackendInputs("ForwardBackward", layout_, weights_set_,
                                     max_batch_, x, labels));
  if (static_cast<int64_t>(grad.size()) != layout_.num_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardBackward: grad has ", grad.size(),
                     " floats, expected ", layout_.num_params()));
  }
  // Written every step: the buffer may be a fresh one from the wire pool.
  std::fill(grad.begin(), grad.end(), kGradientValue);
  return std::log(static_cast<float>(layout_.num_classes()));
}

absl::StatusOr<EvalResult> NullBackend::Evaluate(
    absl::Span<const float> x, absl::Span<const int32_t> labels) {
  RETURN_IF_ERROR(CheckBackendInputs("Evaluate", layout_, weights_set_,
                                     /*max_batch=*/0, x, labels));
  EvalResult r;
  r.count = static_cast<int64_t>(labels.size());
  r.correct = std::count(labels.begin(), labels.end(), 0);
  r.loss_sum = r.count * std::log(static_cast<double>(layout_.num_classes()));
  return r;
}

}  // namespace dp
