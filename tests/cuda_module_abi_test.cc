// dp-worker refuses a CUDA module of another build (exit 2, naming both
// builds) instead of calling into it: the module's ABI string carries a
// hash of the interface the two share. Runs without a GPU or CUDA.
#include <string>

#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"
#include "worker/cuda_module.h"

namespace dp {
namespace {

TEST(CudaModuleAbiTest, AModuleOfAnotherBuildIsRefused) {
  absl::StatusOr<CudaModule*> module = LoadCudaModule(DP_FAKE_CUDA_MODULE);
  ASSERT_FALSE(module.ok());
  EXPECT_EQ(module.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(module.status().message().find("is from another build"),
            std::string::npos)
      << module.status();
  EXPECT_NE(module.status().message().find(DP_CUDA_MODULE_ABI),
            std::string::npos)
      << module.status();
}

TEST(CudaModuleAbiTest, DpWorkerExits2OnAModuleOfAnotherBuild) {
  Subprocess worker({DP_WORKER_BINARY, "--rank=0", "--ps=127.0.0.1:1",
                     "--retry_for_s=0", "--backend=cuda",
                     std::string("--cuda_module=") + DP_FAKE_CUDA_MODULE});
  EXPECT_EQ(worker.Wait(absl::Seconds(60)), kExitConfigError)
      << worker.output();
  EXPECT_NE(worker.output().find("is from another build"), std::string::npos)
      << worker.output();
}

}  // namespace
}  // namespace dp
