// Which backend a worker runs, decided once before it connects: "cpu", "cuda"
// (the run-time loaded module on one GPU, or an error naming why not) or
// "auto" (cuda when it can, else cpu, saying why). "null" (null_backend.h)
// is for benchmarks only: accepted when named, never listed, never chosen
// by auto.
#ifndef DP_WORKER_BACKEND_CHOICE_H_
#define DP_WORKER_BACKEND_CHOICE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_layout.h"
#include "worker/backend.h"
#include "worker/cuda_module.h"

namespace dp {

struct BackendRequest {
  std::string name = "auto";  // auto | cpu | cuda (| null: benchmarks)
  // CUDA device ordinal; -1: rank modulo the visible devices, so that the
  // workers of one host each get their own GPU.
  int device = -1;
  int rank = 0;
  std::string cuda_module;  // empty: CudaModuleSearchPath()
};

class BackendChoice {
 public:
  BackendChoice() = default;  // the CPU backend

  // INVALID_ARGUMENT for an unknown name or a device < -1. For "cuda",
  // FAILED_PRECONDITION (NOT_FOUND for a missing module) naming the reason
  // it cannot run, marked IsCannotRunHere (worker/exit_code.h) where the
  // node is at fault rather than the image; "auto" then chooses cpu and
  // why() says why. "auto" without a CUDA driver does not load the module
  // at all.
  static absl::StatusOr<BackendChoice> Resolve(const BackendRequest& request);

  bool cuda() const { return module_ != nullptr; }
  // The benchmark backend without arithmetic.
  bool null() const { return null_; }
  const GpuInfo& gpu() const { return gpu_; }  // when cuda()
  // Why "auto" chose the CPU; empty otherwise.
  const std::string& why() const { return why_; }
  // One line for the log: "cuda on GPU 1 of 8: NVIDIA H200, 139.8 GiB,
  // compute capability 9.0" or "cpu (auto: the CUDA module is not ...)".
  std::string Describe() const;

  // The backend itself; options.device is set from the choice.
  absl::StatusOr<std::unique_ptr<Backend>> Create(const ModelLayout& layout,
                                                  BackendOptions options) const;

 private:
  CudaModule* module_ = nullptr;
  bool null_ = false;
  GpuInfo gpu_;
  std::string why_;
};

// What Resolve refuses without looking for a device: an unknown name. (Its
// message lists auto, cpu and cuda: null is not for users.)
absl::Status CheckBackendName(absl::string_view name);

// Resolve({name}) then Create: for tests and benchmarks.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    absl::string_view name, const ModelLayout& layout,
    const BackendOptions& options);

}  // namespace dp

#endif  // DP_WORKER_BACKEND_CHOICE_H_
