// The CUDA module as dp-worker loads it, in a process that, like
// dp-worker, links no CUDA library: once it is loaded (cudart, cuBLAS and
// cuBLASLt with it), the threads that serve /metrics still start. Linked at
// start, cuBLASLt's 94 KiB of thread-local storage sat in every thread's
// stack, and civetweb's 100 KiB stacks could not hold it.
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/exposition.h"
#include "worker/cuda_module.h"
#include "worker/worker_metrics.h"

namespace dp {
namespace {

TEST(CudaModuleTest, MetricsAreServedAfterTheModuleIsLoaded) {
  absl::StatusOr<CudaModule*> module = LoadCudaModule(DP_CUDA_MODULE_FILE);
  ASSERT_TRUE(module.ok()) << module.status();
  // Whether or not there is a GPU: what matters is what is loaded.
  (void)(*module)->DeviceCount();
  WorkerMetrics metrics(0);
  auto endpoint = metrics.Serve("127.0.0.1", kMetricsAnyPort);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  absl::StatusOr<std::string> body =
      HttpGet("127.0.0.1", (*endpoint)->port(), "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_TRUE(absl::StrContains(*body, "dp_build_info")) << *body;
}

}  // namespace
}  // namespace dp
