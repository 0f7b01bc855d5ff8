// dp-worker's exit codes, one per outcome a Job's podFailurePolicy treats
// differently (docs/command-line.md): a configuration error (2) fails the
// Job, dp-ps unreachable for --retry_for_s (4) is retried without counting,
// a node that cannot run the backend (5) is retried, counted per rank.
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "tests/subprocess.h"

namespace dp {
namespace {

const absl::Duration kTimeout = absl::Seconds(60);

// A worker of a dp-ps that nobody runs: nothing listens on port 1.
std::unique_ptr<Subprocess> StartLoneWorker(std::vector<std::string> args,
                                            std::vector<std::string> env = {}) {
  std::vector<std::string> argv = {DP_WORKER_BINARY, "--rank=0",
                                   "--ps=127.0.0.1:1"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<Subprocess>(argv, env);
}

TEST(WorkerExitTest, DpPsUnreachableForRetryForSIsExitFour) {
  auto w = StartLoneWorker({"--backend=cpu", "--retry_for_s=1"});
  EXPECT_EQ(w->Wait(kTimeout), kExitPsUnreachable) << w->output();
  EXPECT_NE(w->output().find("dp-ps at 127.0.0.1:1 is unavailable"),
            std::string::npos)
      << w->output();
}

TEST(WorkerExitTest, MissingCudaModuleIsAConfigurationError) {
  // The image lacks its module: the same on every node, so no retry helps.
  auto w = StartLoneWorker(
      {"--backend=cuda", "--cuda_module=/nonexistent/libdp_cuda.so"});
  EXPECT_EQ(w->Wait(kTimeout), kExitConfigError) << w->output();
  EXPECT_NE(w->output().find("/nonexistent/libdp_cuda.so"), std::string::npos)
      << w->output();
}

TEST(WorkerExitTest, CudaWhereNoGpuIsUsableIsExitFiveCannotRunHere) {
#ifndef DP_CUDA_MODULE_FILE
  GTEST_SKIP() << "built without CUDA: no module to load";
#else
  // No GPU visible (here: none, or no driver at all): the node's fault,
  // another node may run this rank.
  auto w =
      StartLoneWorker({"--backend=cuda", "--cuda_module=" DP_CUDA_MODULE_FILE},
                      {"CUDA_VISIBLE_DEVICES="});
  EXPECT_EQ(w->Wait(kTimeout), kExitCannotRunHere) << w->output();
  EXPECT_NE(w->output().find("cannot run on this node"), std::string::npos)
      << w->output();
#endif
}

TEST(WorkerExitTest, AnUnknownFlagIsAConfigurationError) {
  auto w = StartLoneWorker({"--no_such_flag=1"});
  EXPECT_EQ(w->Wait(kTimeout), kExitConfigError) << w->output();
}

}  // namespace
}  // namespace dp
