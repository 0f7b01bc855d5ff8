// Backend choice: the CPU backend, or the CUDA module on one device.
#include "worker/backend_choice.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/cpu_backend.h"
#include "worker/exit_code.h"
#include "worker/null_backend.h"

namespace dp {
namespace {

// The CUDA module with its device opened, or why not. A module that is
// missing or does not load is the image's fault, the same on every node; no
// driver, one too old, no GPU visible or none the module has code for is
// this node's (CannotRunHere). The module loads without a driver: cudart
// looks for libcuda only when first called.
absl::Status ResolveCuda(const BackendRequest& request, CudaModule** module,
                         GpuInfo* gpu) {
  ASSIGN_OR_RETURN(*module, LoadCudaModule(request.cuda_module));
  absl::StatusOr<int> count = (*module)->DeviceCount();
  if (!count.ok()) return CannotRunHere(count.status());
  int device = request.device;
  if (device < 0) device = request.rank % *count;
  absl::StatusOr<GpuInfo> opened = (*module)->OpenDevice(device);
  if (!opened.ok()) return CannotRunHere(opened.status());
  *gpu = *opened;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckBackendName(absl::string_view name) {
  if (name == "cpu" || name == "cuda" || name == "auto" || name == "null") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown backend \"", name, "\"; valid names: auto, cpu, cuda"));
}

absl::StatusOr<BackendChoice> BackendChoice::Resolve(
    const BackendRequest& request) {
  RETURN_IF_ERROR(CheckBackendName(request.name));
  if (request.device < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be a device ordinal >= 0 (or -1: rank modulo the "
        "visible GPUs), got ",
        request.device));
  }
  BackendChoice choice;
  if (request.name == "cpu") return choice;
  if (request.name == "null") {
    choice.null_ = true;
    return choice;
  }
  // auto on a host without a driver: the CPU, without loading the module.
  if (request.name == "auto") {
    if (absl::Status driver = CudaDriverPresent(); !driver.ok()) {
      choice.why_ = std::string(driver.message());
      return choice;
    }
  }
  CudaModule* module = nullptr;
  GpuInfo gpu;
  const absl::Status opened = ResolveCuda(request, &module, &gpu);
  if (opened.ok()) {
    choice.module_ = module;
    choice.gpu_ = gpu;
    return choice;
  }
  if (request.name == "cuda") {
    // Keep the code (NOT_FOUND, FAILED_PRECONDITION: exit code 2) and
    // whether the node is at fault (exit code 5).
    absl::Status named(opened.code(),
                       absl::StrCat("backend \"cuda\": ", opened.message()));
    return IsCannotRunHere(opened) ? CannotRunHere(std::move(named)) : named;
  }
  choice.why_ = std::string(opened.message());
  return choice;
}

std::string BackendChoice::Describe() const {
  if (null_) return "null (benchmarks only: no arithmetic)";
  if (!cuda()) {
    return why_.empty() ? "cpu" : absl::StrCat("cpu (auto: ", why_, ")");
  }
  return absl::StrFormat(
      "cuda on GPU %d of %d: %s, %.1f GiB, compute capability %d.%d",
      gpu_.device, gpu_.device_count, gpu_.name,
      static_cast<double>(gpu_.memory_bytes) / (1 << 30), gpu_.cc_major,
      gpu_.cc_minor);
}

absl::StatusOr<std::unique_ptr<Backend>> BackendChoice::Create(
    const ModelLayout& layout, BackendOptions options) const {
  if (cuda()) {
    options.device = gpu_.device;
    return module_->CreateBackend(layout, options);
  }
  if (null_) return std::unique_ptr<Backend>(new NullBackend(layout, options));
  ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu,
                   CpuBackend::Create(layout, options));
  return std::unique_ptr<Backend>(std::move(cpu));
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    absl::string_view name, const ModelLayout& layout,
    const BackendOptions& options) {
  BackendRequest request;
  request.name = std::string(name);
  ASSIGN_OR_RETURN(BackendChoice choice, BackendChoice::Resolve(request));
  return choice.Create(layout, options);
}

}  // namespace dp
