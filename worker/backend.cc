// CreateBackend: picks the compute backend by name ("cpu", "cuda", "auto").
#include "worker/backend.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/cpu_backend.h"
#ifdef DP_HAVE_CUDA
#include "worker/cuda_backend.h"
#endif

namespace dp {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpu(
    const ModelLayout& layout, const BackendOptions& options) {
  absl::StatusOr<std::unique_ptr<CpuBackend>> cpu =
      CpuBackend::Create(layout, options);
  if (!cpu.ok()) return cpu.status();
  return std::unique_ptr<Backend>(std::move(cpu).value());
}

}  // namespace

absl::Status CheckBackend(absl::string_view name) {
  if (name == "cpu" || name == "auto") return absl::OkStatus();
  if (name == "cuda") {
#ifdef DP_HAVE_CUDA
    std::string why;
    if (CudaDeviceAvailable(&why)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("backend \"cuda\": ", why));
#else
    return absl::FailedPreconditionError(
        "backend \"cuda\": this dp-worker was built without CUDA");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown backend \"", name, "\"; valid names: auto, cpu, cuda"));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    absl::string_view name, const ModelLayout& layout,
    const BackendOptions& options) {
  if (name == "cpu") return CreateCpu(layout, options);
  if (name == "cuda") {
#ifdef DP_HAVE_CUDA
    return CreateCudaBackend(layout, options);
#else
    return absl::FailedPreconditionError(
        "backend \"cuda\": this dp-worker was built without CUDA");
#endif
  }
  if (name == "auto") {
#ifdef DP_HAVE_CUDA
    if (CudaDeviceAvailable(nullptr)) return CreateCudaBackend(layout, options);
#endif
    return CreateCpu(layout, options);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown backend \"", name, "\"; valid names: auto, cpu, cuda"));
}

}  // namespace dp
