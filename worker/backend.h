// The compute interface of a worker: forward, backward and evaluation of an
// MLP (ModelLayout) with ReLU between layers and mean cross-entropy loss.
// Implementations: CpuBackend (the reference, OpenBLAS) and CudaBackend (in
// the run-time loaded CUDA module, see cuda_module.h). No device headers
// here, so the trainer and tests stay device-agnostic. Choosing and creating
// a backend by name: backend_choice.h.
#ifndef DP_WORKER_BACKEND_H_
#define DP_WORKER_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_layout.h"

namespace dp {

// The MLP a job trains, which is all a backend computes: FAILED_PRECONDITION
// naming the Python worker when the job's model (JobConfig.tensors) is not
// an MLP, INVALID_ARGUMENT when its widths make none.
absl::StatusOr<ModelLayout> JobMlp(const JobConfig& job);

struct EvalResult {
  int64_t correct = 0;    // argmax(logits) == label
  double loss_sum = 0.0;  // sum over samples of the cross-entropy
  int64_t count = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda (NVIDIA H200)", ...
  virtual std::string Name() const = 0;

  // Replaces the weights; params has layout.num_params() floats in the flat
  // layout of ModelLayout.
  [[nodiscard]] virtual absl::Status SetWeights(
      absl::Span<const float> params) = 0;
  // SetWeights that may take *params' memory instead of copying it (the
  // worker receives new weights every step); *params is then left with a
  // buffer of the same size and unspecified contents.
  [[nodiscard]] virtual absl::Status TakeWeights(std::vector<float>* params) {
    return SetWeights(*params);
  }
  // SetWeights from the weights where they lie, one span per tensor of the
  // layout (ModelLayout::tensors() order and sizes): in dp-ps's shared
  // memory, or the worker's own buffer. The caller keeps that memory
  // unchanged until the next SetWeights, TakeWeights or ViewWeights, so a
  // backend may compute from it without a copy (CpuBackend, NullBackend).
  // The default copies it: SetWeights of the tensors in one piece, straight
  // from the spans when they are one already.
  [[nodiscard]] virtual absl::Status ViewWeights(
      absl::Span<const absl::Span<const float>> tensors);

  // x is (batch, input_dim) row-major, labels (batch) in [0, num_classes).
  // Writes the gradient of the mean cross-entropy over the batch w.r.t. every
  // parameter into grad (num_params floats, flat layout) and returns the mean
  // loss. batch may be anything from 1 to the max_batch given at creation.
  virtual absl::StatusOr<float> ForwardBackward(
      absl::Span<const float> x, absl::Span<const int32_t> labels,
      absl::Span<float> grad) = 0;

  // Forward only, over any number of samples (processed in chunks).
  virtual absl::StatusOr<EvalResult> Evaluate(
      absl::Span<const float> x, absl::Span<const int32_t> labels) = 0;
};

struct BackendOptions {
  int max_batch = 512;  // largest batch ForwardBackward will be given
  int cpu_threads = 1;  // BLAS threads of the CPU backend
  bool tf32 = false;    // CUDA: allow TF32 tensor-core math
  int device = 0;       // CUDA: the device ordinal to run on
};

// INVALID_ARGUMENT, naming the tensor, unless `tensors` has one span of the
// right size per tensor of `layout`: the check of ViewWeights.
absl::Status CheckTensorViews(
    const ModelLayout& layout,
    absl::Span<const absl::Span<const float>> tensors);

// The input checks every backend makes before computing, so that all refuse
// the same inputs with the same messages. `what` names the call
// ("ForwardBackward", "Evaluate"); max_batch > 0 bounds the number of
// samples (ForwardBackward), 0 allows any number (Evaluate). Returns
// FAILED_PRECONDITION before weights are set; INVALID_ARGUMENT for a batch
// size out of range, an x of the wrong size or a label outside the classes.
absl::Status CheckBackendInputs(const char* what, const ModelLayout& layout,
                                bool weights_set, int max_batch,
                                absl::Span<const float> x,
                                absl::Span<const int32_t> labels);

}  // namespace dp

#endif  // DP_WORKER_BACKEND_H_
