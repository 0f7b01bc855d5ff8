// A consequence of the data order: N workers with batch b compute
// the same update as 1 worker with batch N*b, up to float rounding. Runs the
// real coordinator and CPU backend on Fashion-MNIST, in one process.
#include <cmath>
#include <memory>

#include "common/data_order.h"
#include "common/dataset.h"
#include "gtest/gtest.h"
#include "server/step_coordinator.h"
#include "tests/coordinator_harness.h"
#include "worker/backend.h"
#include "worker/backend_choice.h"

namespace dp {
namespace {

constexpr int kGlobalBatch = 64;
constexpr int kSteps = 5;

std::vector<float> Train(const Dataset& data, int world) {
  const ModelLayout layout = ModelLayout::SimpleNet();
  CoordinatorSetup setup;
  setup.job = TestJob(world);
  setup.job.schedule.batch_size = kGlobalBatch / world;
  setup.job.schedule.seed = 11;
  setup.job.dataset = "fashion-mnist";
  setup.init_seed = 11;
  setup.data = data.fingerprint;
  const std::unique_ptr<StepCoordinator> owned =
      MakeTestCoordinator(layout, setup);
  StepCoordinator& coordinator = *owned;
  Schedule schedule = setup.job.schedule;
  schedule.num_samples = data.num_samples;
  BatchSampler sampler(schedule);
  BackendOptions options;
  options.max_batch = kGlobalBatch;
  auto backend = CreateBackend("cpu", layout, options);
  EXPECT_TRUE(backend.ok());
  const int b = schedule.batch_size;
  std::vector<float> x(b * kImageDim), grad(layout.num_params());
  std::vector<int32_t> y(b);
  for (int step = 0; step < kSteps; ++step) {
    const TrainingState now = coordinator.Snapshot();
    EXPECT_TRUE((*backend)->SetWeights(now.params).ok());
    for (int r = 0; r < world; ++r) {
      GatherBatch(data, sampler.Indices(step, r), x.data(), y.data());
      auto loss = (*backend)->ForwardBackward(x, y, absl::MakeSpan(grad));
      EXPECT_TRUE(loss.ok());
      EXPECT_TRUE(coordinator.Push(r, step, 0, WireBytes(grad), *loss).ok());
    }
  }
  EXPECT_EQ(coordinator.Snapshot().step, kSteps);
  return coordinator.Snapshot().params;
}

double RelativeL2(const std::vector<float>& a, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return std::sqrt(diff / norm);
}

TEST(EquivalenceTest, OneBy64TwoBy32FourBy16GiveTheSameWeightsAfterFiveSteps) {
  auto data = LoadIdx(kDefaultFashionMnistDir, Split::kTrain);
  ASSERT_TRUE(data.ok())
      << data.status() << " (scripts/setup.sh installs dataset-fashion-mnist)";
  const std::vector<float> one = Train(*data, 1);
  const std::vector<float> init = InitParams(ModelLayout::SimpleNet(), 11);
  // The comparison means something only if training moved the weights
  // much further than the tolerance.
  ASSERT_GT(RelativeL2(one, init), 1e-3);
  for (int world : {2, 4}) {
    const double d = RelativeL2(Train(*data, world), one);
    std::printf("%d x %d vs 1 x %d: relative L2 difference %.3g\n", world,
                kGlobalBatch / world, kGlobalBatch, d);
    EXPECT_LE(d, 1e-5) << world << " workers";
  }
}

}  // namespace
}  // namespace dp
