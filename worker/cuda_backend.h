// Entry points of the CUDA backend (implemented in a .cu file, compiled only
// when CMake finds CUDA and defines DP_HAVE_CUDA). No CUDA headers here.
#ifndef DP_WORKER_CUDA_BACKEND_H_
#define DP_WORKER_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_layout.h"
#include "worker/backend.h"

namespace dp {

// Knobs of the CUDA backend that the generic BackendOptions do not have.
struct CudaOptions {
  // Capture forward+backward in one CUDA graph per batch size (from the
  // second step of that size; a handful of sizes are cached) and replay it:
  // one launch per step instead of ~15.
  // Off: every kernel and cuBLAS call is launched one by one. Both give
  // bitwise-identical results.
  bool graphs = true;
};

// SimpleNet (any ModelLayout MLP) on one CUDA device: weights resident on the
// device, cuBLAS SGEMM for every matrix product (TF32 only when
// BackendOptions::tf32), small fused kernels for the rest, one stream.
// Deterministic: the same weights and batch give bitwise-identical gradients.
// Not thread-safe: one caller at a time.
class CudaBackend : public Backend {
 public:
  // Uses the current CUDA device. FAILED_PRECONDITION with the reason when no
  // usable device is present; INVALID_ARGUMENT when max_batch < 1;
  // RESOURCE_EXHAUSTED when the buffers for max_batch do not fit.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      const ModelLayout& layout, const BackendOptions& options,
      const CudaOptions& cuda_options = CudaOptions());

  // The two device-side halves of ForwardBackward, for benchmarks that time
  // the computation alone. UploadBatch validates and copies a batch to the
  // device (same contract as ForwardBackward's x and labels);
  // ComputeUploaded runs forward+backward on it, leaving the gradient on the
  // device, and returns when the device is done.
  [[nodiscard]] virtual absl::Status UploadBatch(
      absl::Span<const float> x, absl::Span<const int32_t> labels) = 0;
  [[nodiscard]] virtual absl::Status ComputeUploaded() = 0;
};

// A cuBLAS backend on the current CUDA device. FAILED_PRECONDITION with the
// reason when no usable device is present; INVALID_ARGUMENT on bad options.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(
    const ModelLayout& layout, const BackendOptions& options);

// True when a CUDA device can be used; otherwise false, and *why (if not
// null) says why (no driver, no device, no kernel image for this device...).
bool CudaDeviceAvailable(std::string* why);

}  // namespace dp

#endif  // DP_WORKER_CUDA_BACKEND_H_
