// The CPU reference backend: the definition of every operation of the model
// (forward, loss, backward, evaluation) in plain loops around OpenBLAS sgemm.
// The CUDA backend is validated against this one.
#ifndef DP_WORKER_CPU_BACKEND_H_
#define DP_WORKER_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "worker/backend.h"

namespace dp {

// Not thread-safe: one caller at a time (each worker owns one backend).
class CpuBackend : public Backend {
 public:
  // Allocates every activation and gradient buffer for options.max_batch, so
  // that ForwardBackward and Evaluate never allocate. INVALID_ARGUMENT when
  // max_batch < 1 or cpu_threads < 1. Note: the OpenBLAS thread count
  // (options.cpu_threads) is process-wide; the last backend created wins.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      const ModelLayout& layout, const BackendOptions& options);

  std::string Name() const override { return "cpu"; }

  // Swaps buffers with *params: no copy.
  [[nodiscard]] absl::Status TakeWeights(std::vector<float>* params) override;
  [[nodiscard]] absl::Status SetWeights(
      absl::Span<const float> params) override;
  // Computes from the tensors where they lie: no copy.
  [[nodiscard]] absl::Status ViewWeights(
      absl::Span<const absl::Span<const float>> tensors) override;

  // FAILED_PRECONDITION before the first SetWeights; INVALID_ARGUMENT on any
  // size mismatch or label outside [0, num_classes).
  absl::StatusOr<float> ForwardBackward(absl::Span<const float> x,
                                        absl::Span<const int32_t> labels,
                                        absl::Span<float> grad) override;

  // Any number of samples (0 included), in chunks of max_batch. Argmax ties go
  // to the lowest class index.
  absl::StatusOr<EvalResult> Evaluate(
      absl::Span<const float> x, absl::Span<const int32_t> labels) override;

 private:
  CpuBackend(const ModelLayout& layout, const BackendOptions& options);

  // Runs every layer on x (B, input_dim); afterwards act_[l] holds the output
  // of layer l, (B, dims[l+1]): after ReLU for hidden layers, logits for the
  // last one.
  void Forward(const float* x, int B);
  // Computes from params_ from now on.
  void UseOwnWeights();
  const float* weight(int layer) const { return tensors_[2 * layer]; }
  const float* bias(int layer) const { return tensors_[2 * layer + 1]; }

  ModelLayout layout_;
  int max_batch_;
  bool weights_set_ = false;
  std::vector<float> params_;  // (num_params) flat layout
  // Where each tensor of the layout is read from: params_, or the memory
  // of the last ViewWeights.
  std::vector<const float*> tensors_;
  std::vector<std::vector<float>> act_;  // act_[l] is (max_batch, dims[l+1])
  std::vector<float> dbuf_[2];           // (max_batch, max hidden dim) each
  std::vector<float> dlogits_;           // (max_batch, num_classes)
};

}  // namespace dp

#endif  // DP_WORKER_CPU_BACKEND_H_
