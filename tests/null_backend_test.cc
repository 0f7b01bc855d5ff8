// The benchmark backend without arithmetic: what it returns, where it is
// refused (auto never picks it, the user-facing name list does not show it,
// a job on real data does not take it), and that a job with it runs to its
// end on both data planes.
#include "worker/null_backend.h"

#include <cmath>
#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/model_layout.h"
#include "gtest/gtest.h"
#include "tests/job_runner.h"
#include "worker/backend_choice.h"

namespace dp {
namespace {

// dp-ps refuses a gradient value beyond this (server/adam.h).
constexpr float kDpPsMaxAbsGradient = 1e15f;

TEST(NullBackendTest, GradientIsTheModelsSizeFiniteAndWithinDpPsLimits) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  BackendOptions options;
  options.max_batch = 4;
  NullBackend backend(layout, options);
  std::vector<float> x(2 * layout.input_dim(), 0.5f);
  std::vector<int32_t> y = {3, 0};
  std::vector<float> grad(layout.num_params(), NAN);
  // As every backend: nothing before the weights are set.
  EXPECT_EQ(backend.ForwardBackward(x, y, absl::MakeSpan(grad)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<float> weights(layout.num_params(), 0.0f);
  ASSERT_TRUE(backend.TakeWeights(&weights).ok());
  absl::StatusOr<float> loss =
      backend.ForwardBackward(x, y, absl::MakeSpan(grad));
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_FLOAT_EQ(*loss, std::log(10.0f));
  int64_t bad = 0;
  for (float g : grad) {
    if (!std::isfinite(g) || std::fabs(g) > kDpPsMaxAbsGradient) ++bad;
  }
  EXPECT_EQ(bad, 0) << "of " << grad.size() << " values";
  // A wrong size is refused, not half written.
  std::vector<float> short_grad(layout.num_params() - 1);
  EXPECT_EQ(
      backend.ForwardBackward(x, y, absl::MakeSpan(short_grad)).status().code(),
      absl::StatusCode::kInvalidArgument);
  absl::StatusOr<EvalResult> eval = backend.Evaluate(x, y);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->count, 2);
  EXPECT_EQ(eval->correct, 1);  // label 0: the argmax of equal logits
}

TEST(NullBackendTest, AutoNeverChoosesItAndTheNameListDoesNotShowIt) {
  BackendRequest request;
  request.name = "auto";
  absl::StatusOr<BackendChoice> choice = BackendChoice::Resolve(request);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_FALSE(choice->null()) << choice->Describe();
  const absl::Status unknown = CheckBackendName("nul");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(unknown.message()).find("null"), std::string::npos)
      << unknown.message();
  request.name = "null";
  choice = BackendChoice::Resolve(request);
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(choice->null());
}

TEST(NullBackendTest, WorkerHelpDoesNotListIt) {
  Subprocess help({DP_WORKER_BINARY, "--help"});
  EXPECT_EQ(help.Wait(kJobTimeout), 0);
  const std::string& out = help.output();
  const size_t flag = out.find("--backend ");
  ASSERT_NE(flag, std::string::npos) << out;
  const std::string line = out.substr(flag, out.find('\n', flag) - flag);
  EXPECT_NE(line.find("auto | cpu | cuda"), std::string::npos) << line;
  EXPECT_EQ(line.find("null"), std::string::npos) << line;
}

TEST(NullBackendTest, WorkerIsRefusedByAJobOnRealData) {
  int port = 0;
  auto ps = StartServer({"--workers=1", "--dataset=fashion-mnist"}, &port);
  auto w = StartWorker(port, 0, {"--backend=null"});
  EXPECT_EQ(w->Wait(kJobTimeout), kExitConfigError) << w->output();
  EXPECT_NE(w->output().find("the null backend is for benchmarks"),
            std::string::npos)
      << w->output();
  ps->Signal(SIGTERM);
  EXPECT_EQ(ps->Wait(kJobTimeout), kExitInterrupted) << ps->output();
}

TEST(NullBackendTest, SyntheticJobRunsToTheEndOnBothDataPlanes) {
  for (const std::string plane : {"shm", "grpc"}) {
    SCOPED_TRACE(plane);
    JobResult r = RunJob({"--dataset=synthetic", "--batch_size=1",
                          "--epochs=100", "--max_steps=30"},
                         2, {"--backend=null", "--data_plane=" + plane});
    EXPECT_EQ(r.ps_exit, 0) << r.ps_output;
    EXPECT_EQ(r.worker_exits, (std::vector<int>{0, 0}));
    EXPECT_NE(r.ps_output.find("done: 30 steps"), std::string::npos)
        << r.ps_output;
  }
}

}  // namespace
}  // namespace dp
