// The CUDA backend (implemented in cuda_backend.cu, built only when CMake
// finds CUDA): what the CUDA module offers the worker (cuda_module.h), and
// what its tests and benchmark use directly. No CUDA headers here.
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
#include "worker/cuda_module.h"

namespace dp {

// Knobs of the CUDA backend that the generic BackendOptions do not have.
struct CudaOptions {
  // Capture forward+backward in one CUDA graph per batch size (from the
  // second step of that size; a handful of sizes are cached) and replay it:
  // one launch per step instead of ~15.
  // Off: every kernel and cuBLAS call is launched one by one. Both give
  // bitwise-identical results. A failed capture turns graphs off for the
  // backend's life.
  bool graphs = true;
  // Tests only: every graph capture fails, as one may on a device or
  // driver that cannot capture a call; the backend then launches one by one.
  bool fail_captures_for_testing = false;
};

// SimpleNet (any ModelLayout MLP) on one CUDA device: weights resident on the
// device, cuBLAS SGEMM for every matrix product (TF32 only when
// BackendOptions::tf32), small fused kernels for the rest, one stream.
// Deterministic: the same weights and batch give bitwise-identical gradients.
// Not thread-safe: one caller at a time.
class CudaBackend : public Backend {
 public:
  // Runs on device options.device (every call makes it the calling thread's
  // device). FAILED_PRECONDITION with the reason when it cannot be used;
  // INVALID_ARGUMENT when max_batch < 1; RESOURCE_EXHAUSTED when the
  // buffers for max_batch do not fit.
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

// The number of visible CUDA devices, or FAILED_PRECONDITION saying why
// there is none (no driver, a driver too old for this CUDA, no device).
absl::StatusOr<int> CudaDeviceCount();

// Makes `device` the calling thread's CUDA device and checks that this build
// has code it can run; FAILED_PRECONDITION naming the reason otherwise.
absl::StatusOr<GpuInfo> OpenCudaDevice(int device);

// The code this build holds, e.g. "sm_75 sm_80 sm_120, PTX compute_120".
std::string CudaArchitectures();

}  // namespace dp

#endif  // DP_WORKER_CUDA_BACKEND_H_
