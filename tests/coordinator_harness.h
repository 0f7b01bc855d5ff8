// A StepCoordinator for the tests that drive it without the network: the
// job, initial state and registrations the coordinator tests share, and the
// calls they repeat (a rank's gradient of a step pushed, a whole step
// pushed, pulled weights read back).
#ifndef DP_TESTS_COORDINATOR_HARNESS_H_
#define DP_TESTS_COORDINATOR_HARNESS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/job_config.h"
#include "common/model_layout.h"
#include "common/shard_plan.h"
#include "common/tensor_codec.h"
#include "server/coordinator_mirror.h"
#include "server/elastic_options.h"
#include "server/step_coordinator.h"

namespace dp {

// The ranks of TestJob's default setup (CoordinatorSetup::job).
inline constexpr int kTestWorld = 3;

// The data every test rank registers with: 1000 samples.
inline const DataFingerprint kTestData{1000, 0x1234};

// A synthetic job of `world` ranks, 4 samples a micro-batch, one epoch;
// micro_batches 0 is one a rank.
JobConfig TestJob(int world, int micro_batches = 0, int min_workers = 0);

struct CoordinatorSetup {
  JobConfig job = TestJob(kTestWorld);
  uint64_t init_seed = 1;  // the state is InitParams(layout, init_seed)
  int update_threads = 1;
  ShardSpec shard;  // count 1: the whole vector
  // Set (SetElastic) before any rank registers.
  std::optional<ElasticOptions> elastic;
  int registered = -1;  // ranks [0, registered) register; -1: world_size
  DataFingerprint data = kTestData;
};

// A coordinator of `layout` as `setup` says, its state the shard's range
// of InitParams(layout, init_seed). A registration that fails fails the
// test.
std::unique_ptr<StepCoordinator> MakeTestCoordinator(
    const ModelLayout& layout, const CoordinatorSetup& setup = {});

// Registers `rank` (or kAnyRank) with the coordinator's model and `data`,
// from the process `worker_id`.
[[nodiscard]] absl::StatusOr<StepCoordinator::Registration> RegisterRank(
    StepCoordinator& c, int rank, const DataFingerprint& data = kTestData,
    absl::string_view worker_id = {});

// `values` as they travel in encoding `e`.
std::string WireBytes(absl::Span<const float> values,
                      Encoding e = Encoding::kF32);
// What dp-ps reads from WireBytes(values, e).
std::vector<float> AsRead(absl::Span<const float> values, Encoding e);

// Rank's gradient of `step` over the whole vector: large and small
// magnitudes mixed (rank 0's are 1e8 times the others'), so that their
// float sum in another order has other bits: (a+b)+c != (a+c)+b.
std::vector<float> TestGradient(const ModelLayout& layout, int rank,
                                int64_t step);

// Rank's TestGradient of `step`, cut to the coordinator's shard range and
// sent in `e`, pushed as its own micro-batch with loss 1.
[[nodiscard]] absl::StatusOr<StepCoordinator::PushResult> PushGradient(
    StepCoordinator& c, int rank, int64_t step, Encoding e = Encoding::kF32);

// Every rank of the job pushes its gradient of `step`, in rank order; a
// refused push fails the test.
void PushStep(StepCoordinator& c, int64_t step, Encoding e = Encoding::kF32);

// The blocks of the step's sum that are in, as Observe() shows them.
std::vector<Block> SumBlocks(const StepCoordinator::ObservableState& o);

// The float32 values of pulled weights.
std::vector<float> PulledValues(const StepCoordinator::PulledWeights& w);

}  // namespace dp

#endif  // DP_TESTS_COORDINATOR_HARNESS_H_
