// A backend that does no arithmetic, for benchmarks only: ForwardBackward
// returns a fixed gradient at once, so that a job's step time is its
// exchange alone (what a step costs where the compute is nearly free, as on
// a GPU). Selected by `dp-worker --backend=null`, which --help does not list
// and `auto` never chooses; a worker with it joins only synthetic jobs
// (trainer.cc), so it cannot feed fixed gradients into a real training run.
#ifndef DP_WORKER_NULL_BACKEND_H_
#define DP_WORKER_NULL_BACKEND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "worker/backend.h"

namespace dp {

class NullBackend : public Backend {
 public:
  // Every value of the gradient: finite, far inside dp-ps's limit, and the
  // same every step, so Adam moves each weight by about lr per step.
  static constexpr float kGradientValue = 1e-3f;

  NullBackend(const ModelLayout& layout, const BackendOptions& options);

  std::string Name() const override {
    return "null (benchmark: no arithmetic)";
  }

  // Keeps nothing: no computation reads the weights.
  [[nodiscard]] absl::Status SetWeights(
      absl::Span<const float> params) override;
  // Leaves *params as it is (no copy, no swap).
  [[nodiscard]] absl::Status TakeWeights(std::vector<float>* params) override;
  // Checks the tensors' sizes; reads nothing.
  [[nodiscard]] absl::Status ViewWeights(
      absl::Span<const absl::Span<const float>> tensors) override;

  // The same input checks as every backend, then grad filled with
  // kGradientValue; the loss of zero logits, ln(num_classes).
  absl::StatusOr<float> ForwardBackward(absl::Span<const float> x,
                                        absl::Span<const int32_t> labels,
                                        absl::Span<float> grad) override;

  // As if every logit were zero: loss ln(num_classes) per sample, and the
  // argmax tie goes to class 0 (as in CpuBackend).
  absl::StatusOr<EvalResult> Evaluate(
      absl::Span<const float> x, absl::Span<const int32_t> labels) override;

 private:
  ModelLayout layout_;
  int max_batch_;
  bool weights_set_ = false;
};

}  // namespace dp

#endif  // DP_WORKER_NULL_BACKEND_H_
