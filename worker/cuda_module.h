// The CUDA backend as a module loaded at run time: libdp_cuda.so holds the
// CUDA kernels and links cudart and cuBLAS; dp-worker itself links no CUDA
// library and dlopens the module only when it is asked to use a GPU. Two
// reasons: one worker binary serves CPU and GPU hosts, and cuBLAS's large
// thread-local storage then lives in dynamic TLS instead of the static TLS
// block that glibc carves out of every thread's stack (civetweb's 100 KiB
// threads, which serve /metrics, could not start with cuBLAS linked).
// No CUDA headers here.
#ifndef DP_WORKER_CUDA_MODULE_H_
#define DP_WORKER_CUDA_MODULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_layout.h"
#include "worker/backend.h"

// The module and the worker must come from the same build: they share C++
// types (std::string, absl::Status, Backend) across the boundary.
// DP_CUDA_MODULE_INTERFACE is a hash of the headers that declare them
// (worker/CMakeLists.txt): the version alone is the same for every commit.
#define DP_CUDA_MODULE_ABI \
  "dp-cuda-module/1 dp-ps/" DP_VERSION " interface/" DP_CUDA_MODULE_INTERFACE

namespace dp {

// One CUDA device as the worker reports it (log line and info metric).
struct GpuInfo {
  int device = 0;        // ordinal among the visible devices
  int device_count = 0;  // visible devices
  std::string name;      // "NVIDIA H200"
  int64_t memory_bytes = 0;
  int cc_major = 0;  // compute capability
  int cc_minor = 0;
};

// What libdp_cuda.so provides. One instance per process, never destroyed.
class CudaModule {
 public:
  // Visible CUDA devices. FAILED_PRECONDITION saying why there are none: no
  // driver, a driver too old for this CUDA, or no device visible.
  virtual absl::StatusOr<int> DeviceCount() = 0;
  // Makes `device` the calling thread's device and checks that this build
  // has code it can run. FAILED_PRECONDITION naming the reason: out of
  // range, or no kernel image for its compute capability.
  virtual absl::StatusOr<GpuInfo> OpenDevice(int device) = 0;
  // A CudaBackend on options.device (opened with OpenDevice first).
  virtual absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
      const ModelLayout& layout, const BackendOptions& options) = 0;
  // The code this build holds: "sm_75 sm_80 ... sm_120, PTX compute_120".
  virtual std::string Architectures() = 0;

 protected:
  ~CudaModule() = default;
};

// OK when a CUDA driver (libcuda.so.1) can be loaded; else why not. Cheap,
// and loads nothing of CUDA's runtime or cuBLAS (loading those costs about
// 200 MB of memory even where there is no GPU).
absl::Status CudaDriverPresent();

// The places a worker looks for the module when no path is given: next to
// the dp-worker executable (the build tree), then ../lib/dp-ps/ (installed).
std::vector<std::string> CudaModuleSearchPath();

// Loads the module at `path` (empty: the first of CudaModuleSearchPath that
// exists), once per process; it stays loaded. NOT_FOUND when there is none;
// FAILED_PRECONDITION when it cannot be loaded (a missing CUDA library, a
// module from another build), naming the file and the reason.
absl::StatusOr<CudaModule*> LoadCudaModule(const std::string& path);

}  // namespace dp

// The module's C entry points (looked up with dlsym).
extern "C" {
const char* dp_cuda_module_abi();     // DP_CUDA_MODULE_ABI
dp::CudaModule* dp_cuda_module_v1();  // the process's instance
}

#endif  // DP_WORKER_CUDA_MODULE_H_
