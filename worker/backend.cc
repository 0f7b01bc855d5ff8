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

absl::Status CheckBackendInputs(const char* what, const ModelLayout& layout,
                                bool weights_set, int max_batch,
                                absl::Span<const float> x,
                                absl::Span<const int32_t> labels) {
  if (!weights_set) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": SetWeights has not been called"));
  }
  const int64_t n = static_cast<int64_t>(labels.size());
  if (max_batch > 0 && (n == 0 || n > max_batch)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": batch of ", n,
                                                   " labels, expected 1..",
                                                   max_batch, " (max_batch)"));
  }
  const int64_t want_x = n * layout.input_dim();
  if (static_cast<int64_t>(x.size()) != want_x) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": x has ", x.size(), " floats, expected ", n,
        " samples * input_dim ", layout.input_dim(), " = ", want_x));
  }
  const int C = layout.num_classes();
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= C) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", labels[i], " of sample ", i, " is outside [0, ", C, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBackend(absl::string_view name, bool probe_device) {
  if (name == "cpu" || name == "auto") return absl::OkStatus();
  if (name == "cuda") {
    if (!probe_device) return absl::OkStatus();
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
