// Finding and loading libdp_cuda.so (see cuda_module.h).
#include "worker/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace dp {
namespace {

constexpr char kModuleFile[] = "libdp_cuda.so";

// The directory of the running executable, "" if unknown.
std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string path(buf, n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

absl::StatusOr<CudaModule*> Open(const std::string& path) {
  // RTLD_NOW: a missing CUDA library shows here, with its name, rather than
  // at the first call. RTLD_LOCAL: the module's copies of shared code stay
  // its own.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the CUDA module ", path, ": ", dlerror()));
  }
  // Never dlclosed: backends' code lives in it, and cudart and cuBLAS do
  // not support being unloaded.
  using AbiFn = const char* (*)();
  using EntryFn = CudaModule* (*)();
  auto abi = reinterpret_cast<AbiFn>(dlsym(handle, "dp_cuda_module_abi"));
  auto entry = reinterpret_cast<EntryFn>(dlsym(handle, "dp_cuda_module_v1"));
  if (abi == nullptr || entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a dp-ps CUDA module (no entry point)"));
  }
  if (std::strcmp(abi(), DP_CUDA_MODULE_ABI) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA module ", path, " is from another build (", abi(),
        "; this dp-worker needs ", DP_CUDA_MODULE_ABI, ")"));
  }
  return entry();
}

}  // namespace

absl::Status CudaDriverPresent() {
  // Kept open: a worker that found it goes on to use it.
  if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no CUDA driver (", dlerror(), ")"));
}

std::vector<std::string> CudaModuleSearchPath() {
  const std::string dir = ExecutableDir();
  if (dir.empty()) return {};
  return {absl::StrCat(dir, "/", kModuleFile),
          absl::StrCat(dir, "/../lib/dp-ps/", kModuleFile)};
}

absl::StatusOr<CudaModule*> LoadCudaModule(const std::string& path) {
  std::string file = path;
  if (file.empty()) {
    const std::vector<std::string> places = CudaModuleSearchPath();
    for (const std::string& place : places) {
      if (access(place.c_str(), F_OK) == 0) {
        file = place;
        break;
      }
    }
    if (file.empty()) {
      return absl::NotFoundError(
          absl::StrCat("the CUDA module is not installed (no ", kModuleFile,
                       " in ", absl::StrJoin(places, " or "), ")"));
    }
  } else if (access(file.c_str(), F_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("the CUDA module ", file, " does not exist"));
  }
  static absl::Mutex mu;
  static auto* loaded ABSL_GUARDED_BY(mu) =
      new std::map<std::string, absl::StatusOr<CudaModule*>>();
  absl::MutexLock lock(&mu);
  auto it = loaded->find(file);
  if (it == loaded->end()) it = loaded->emplace(file, Open(file)).first;
  return it->second;
}

}  // namespace dp
