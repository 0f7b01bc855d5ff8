// The trainer against a real dp-ps service on loopback gRPC, in-process:
// what it computes and sends per step when it has to wait.
#include "worker/trainer.h"

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "proto/grpc_server.h"
#include "tests/coordinator_harness.h"
#include "tests/exposition.h"
#include "tests/in_process_ps.h"
#include "worker/ps_group.h"
#include "worker/worker_metrics.h"

namespace dp {
namespace {

double Count(WorkerMetrics& m, const std::string& name, int rank) {
  return Sample(ParseExposition(m.Text()), name,
                {{"role", "worker"}, {"rank", std::to_string(rank)}})
      .value_or(-1);
}

class TrainerWaitTest : public testing::TestWithParam<bool> {};

// Rank 0 starts alone: the first step waits for every rank, so rank 0's
// first exchange (an idle wait: it has no block yet) can only outlast its
// 200 ms deadline, again and again, until rank 1 starts and the wait is
// answered with rank 0's block. It must report and wait again, and compute
// each of its blocks once.
TEST_P(TrainerWaitTest, ABarrierDeadlineWaitsAgainWithoutComputingAgain) {
  const bool fused = GetParam();
  InProcessPsOptions ps_options;
  ps_options.max_steps = 5;
  auto ps = InProcessPs::Start(ps_options);
  ASSERT_TRUE(ps.ok()) << ps.status();
  PsClientOptions client_options;
  client_options.address = (*ps)->address();
  client_options.wait_timeout = absl::Milliseconds(200);
  client_options.max_message_bytes =
      MessageBytesFor((*ps)->layout().num_params());
  PsGroup client0({client_options.address}, client_options),
      client1({client_options.address}, client_options);
  WorkerMetrics metrics0(0), metrics1(1);
  TrainerOptions options;
  options.fused = fused;
  options.rank = 0;
  options.metrics = &metrics0;
  Trainer rank0(&client0, options);
  absl::Status status0;
  std::thread thread0([&] { status0 = rank0.Run(); });

  // The waiting call ends once per deadline: wait for two of them.
  const std::string waits = fused ? "dp_worker_push_pull_duration_seconds_count"
                                  : "dp_worker_barrier_duration_seconds_count";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Count(metrics0, waits, 0) < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(Count(metrics0, waits, 0), 2) << "rank 0 never timed out";

  options.rank = 1;
  options.metrics = &metrics1;
  Trainer rank1(&client1, options);
  const absl::Status status1 = rank1.Run();
  thread0.join();
  ASSERT_TRUE(status0.ok()) << status0;
  ASSERT_TRUE(status1.ok()) << status1;

  EXPECT_EQ(rank0.stats().steps, 5);
  EXPECT_EQ(rank0.stats().gradients, 5) << "a step was computed twice";
  EXPECT_GE(rank0.stats().wait_timeouts, 2);
  EXPECT_EQ(Count(metrics0, "dp_worker_compute_duration_seconds_count", 0), 5);
  EXPECT_EQ(Count(metrics0, "dp_worker_step_duration_seconds_count", 0), 5);
  EXPECT_EQ(Count(metrics0, "dp_worker_wait_timeouts_total", 0),
            rank0.stats().wait_timeouts);
  // One wait per step, one per timeout, and the one answered with the
  // block; the plain protocol pushes once per step besides.
  const double timeouts = rank0.stats().wait_timeouts;
  if (fused) {
    EXPECT_EQ(Count(metrics0, "dp_worker_push_pull_duration_seconds_count", 0),
              5 + timeouts + 1);
  } else {
    EXPECT_EQ(Count(metrics0, "dp_worker_push_duration_seconds_count", 0), 5);
    EXPECT_EQ(Count(metrics0, "dp_worker_barrier_duration_seconds_count", 0),
              5 + timeouts + 1);
  }
  // Every push carries the whole float32 gradient and a header of a few
  // bytes; an idle wait, a header only.
  const int64_t gradient_bytes = (*ps)->layout().num_params() * 4;
  const int64_t idle = fused ? rank0.stats().wait_timeouts + 1 : 0;
  EXPECT_GE(rank0.stats().bytes_sent, 5 * gradient_bytes);
  EXPECT_LT(rank0.stats().bytes_sent, 5 * (gradient_bytes + 64) + 64 * idle);
  EXPECT_EQ(Count(metrics0, "dp_sent_bytes_total", 0),
            rank0.stats().bytes_sent);
}

INSTANTIATE_TEST_SUITE_P(Protocols, TrainerWaitTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Fused" : "Plain";
                         });

// Two in-process shards of a one-worker job, and what each holds once the
// worker's Run returned (its status).
struct ShardedRun {
  absl::Status status;
  std::vector<TrainingState> shards;
};

// The coordinators of the two shards, by shard.
using TwoShards = std::array<StepCoordinator*, 2>;

// `before_call` runs on a shard as each of its calls arrives, with the
// shard's index. The tensors travel through shared memory (and the steps
// through its step channels) when `shm`.
ShardedRun RunOnTwoShards(
    bool shm, std::function<void(int shard, const std::string& method,
                                 const TwoShards& shards)>
                  before_call) {
  std::unique_ptr<InProcessPs> ps[2];
  for (int k : {1, 0}) {
    InProcessPsOptions o;
    o.world_size = 1;
    o.max_steps = 5;
    o.shard = k;
    o.shards = 2;
    o.shared_memory = shm;
    if (before_call) {
      o.before_call = [&ps, before_call, k](const std::string& method) {
        before_call(k, method,
                    TwoShards{&ps[0]->coordinator(), &ps[1]->coordinator()});
      };
    }
    auto started = InProcessPs::Start(o);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return {started.status(), {}};
    ps[k] = *std::move(started);
  }
  PsClientOptions client_options;
  client_options.max_message_bytes =
      MessageBytesFor(ps[0]->layout().num_params());
  client_options.data_plane = shm ? DataPlane::kShm : DataPlane::kGrpc;
  PsGroup group({ps[0]->address(), ps[1]->address()}, client_options);
  TrainerOptions options;
  options.rank = 0;
  Trainer trainer(&group, options);
  ShardedRun run;
  run.status = trainer.Run();
  for (auto& p : ps) run.shards.push_back(p->coordinator().Snapshot());
  return run;
}

// Shard 0 applies a step that shard 1 never saw between the worker's
// registration (both at step 0) and its pull: as when shard 1 restarted
// from a checkpoint older than a push it had taken, which shard 0 got
// after the restart. The shards then answer the pull with different
// versions; the worker must join again (the join rolls shard 0 back), not
// fail, and the model is the undisturbed job's.
class TrainerShardTest : public testing::TestWithParam<bool> {};

TEST_P(TrainerShardTest,
       AShardMovingOnBetweenRegistrationAndPullMeansJoinAgain) {
  int reference_pulls = 0;
  const ShardedRun reference = RunOnTwoShards(
      GetParam(),
      [&reference_pulls](int k, const std::string& method, const TwoShards&) {
        if (k == 0 && absl::EndsWith(method, "/Pull")) ++reference_pulls;
      });
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  bool moved = false;
  int pulls = 0;
  const ShardedRun run = RunOnTwoShards(
      GetParam(), [&moved, &pulls](int k, const std::string& method,
                                   const TwoShards& shards) {
        if (k != 0 || !absl::EndsWith(method, "/Pull")) return;
        ++pulls;
        if (moved) return;
        moved = true;
        auto pushed = PushGradient(*shards[0], 0, 0);
        EXPECT_TRUE(pushed.ok()) << pushed.status();
        EXPECT_EQ(shards[0]->Status().step, 1);
      });
  EXPECT_TRUE(moved);
  // The versions the shards answered with differ: pulling again changes
  // nothing, so the worker registers again after one pull, not after the
  // retries that a rewrite of the weights under a read is worth.
  EXPECT_LE(pulls, reference_pulls + 1);
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.shards.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(run.shards[k].step, 5) << "shard " << k;
    EXPECT_TRUE(run.shards[k].params == reference.shards[k].params)
        << "shard " << k << " differs from the undisturbed job";
  }
}

// Rank 0's gradients of steps [first, last] to both shards, shard 1 first,
// as workers push: the job moves on without the worker under test.
void PushSteps(const TwoShards& shards, int64_t first, int64_t last) {
  for (int64_t step = first; step <= last; ++step) {
    for (StepCoordinator* c : {shards[1], shards[0]}) {
      auto pushed = PushGradient(*c, 0, step);
      EXPECT_TRUE(pushed.ok()) << pushed.status();
    }
  }
}

// The job moves on two steps between the worker's pull of shard 0 and its
// pull of shard 1 (as when its block was backed up and the others run on
// without it): shard 1 no longer holds the version shard 0 gave. That is
// no shard behind: the worker pulls again and goes on, without
// registering again and without rolling any shard back.
TEST_P(TrainerShardTest, AJobMovingOnBetweenTheShardsPullsIsPulledAgain) {
  bool moved = false;
  int registrations = 0, rollbacks = 0;
  const ShardedRun run = RunOnTwoShards(
      GetParam(),
      [&](int k, const std::string& method, const TwoShards& shards) {
        if (absl::EndsWith(method, "/Register")) registrations += k == 0;
        if (absl::EndsWith(method, "/Rollback")) ++rollbacks;
        if (k != 1 || !absl::EndsWith(method, "/Pull") || moved) return;
        const int64_t at = shards[0]->Status().step;
        if (shards[1]->Status().step != at) return;
        moved = true;
        PushSteps(shards, at, at + 1);
      });
  EXPECT_TRUE(moved);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(registrations, 1) << "the worker registered again";
  EXPECT_EQ(rollbacks, 0);
  ASSERT_EQ(run.shards.size(), 2u);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(run.shards[k].step, 5) << k;
}

// The job moves on between a join's registration with shard 0 and its
// registration with shard 1, far enough that the two answer steps two
// apart. They were asked one after the other, not found apart: the worker
// joins at the newest version and rolls nothing back (a rollback would
// throw away the steps in between; to step 0 without a checkpoint). The
// join is forced as in the test above: shard 0 takes a push shard 1 never
// saw, and the worker's first pull finds them apart.
TEST_P(TrainerShardTest, AJobMovingOnBetweenTheShardsRegistrationsIsJoined) {
  bool parted = false, moved = false;
  int rollbacks = 0, registrations = 0;
  const ShardedRun run = RunOnTwoShards(
      GetParam(),
      [&](int k, const std::string& method, const TwoShards& shards) {
        if (absl::EndsWith(method, "/Rollback")) ++rollbacks;
        if (k == 0 && absl::EndsWith(method, "/Pull") && !parted) {
          parted = true;
          auto pushed = PushGradient(*shards[0], 0, 0);
          EXPECT_TRUE(pushed.ok()) << pushed.status();
        }
        if (k != 1 || !absl::EndsWith(method, "/Register")) return;
        if (++registrations != 2 || moved) return;
        // The join: shard 0 answered step 1; shard 1, still at 0, takes
        // step 0 and both run on to step 3 before it answers.
        moved = true;
        ASSERT_EQ(shards[0]->Status().step, 1);
        ASSERT_EQ(shards[1]->Status().step, 0);
        EXPECT_TRUE(PushGradient(*shards[1], 0, 0).ok());
        PushSteps(shards, 1, 2);
      });
  EXPECT_TRUE(moved);
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(rollbacks, 0) << "shards seen apart were rolled back";
  ASSERT_EQ(run.shards.size(), 2u);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(run.shards[k].step, 5) << k;
}

// Over shared memory a step makes no call on either shard: the push and
// the wait go to shard 0 through its step channel, and the push to shard 1
// and the pull of its new weights through shard 1's. Only the join's pull
// of shard 0's current weights is a call; shard 1's of that version goes
// through its channel too.
TEST(TrainerShardChannelTest, EveryShardsStepsGoThroughItsStepChannel) {
  absl::Mutex mu;
  std::map<std::string, int> calls[2];  // by shard: method -> count
  const ShardedRun run = RunOnTwoShards(
      /*shm=*/true, [&](int k, const std::string& method, const TwoShards&) {
        absl::MutexLock lock(&mu);
        ++calls[k][method];
      });
  ASSERT_TRUE(run.status.ok()) << run.status;
  ASSERT_EQ(run.shards.size(), 2u);
  const std::string rpc = "/dp.v1.ParameterServer/";
  const std::string channel = "step channel " + rpc;
  absl::MutexLock lock(&mu);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(run.shards[k].step, 5) << k;
    EXPECT_EQ(calls[k][rpc + "Push"], 0) << k;
    EXPECT_EQ(calls[k][rpc + "PushPull"], 0) << k;
  }
  EXPECT_EQ(calls[0][rpc + "Pull"], 1);
  EXPECT_EQ(calls[1][rpc + "Pull"], 0);
  EXPECT_EQ(calls[0][channel + "PushPull"], 5);
  EXPECT_EQ(calls[1][channel + "Push"], 5);
  EXPECT_EQ(calls[1][channel + "Pull"], 6);
}

INSTANTIATE_TEST_SUITE_P(DataPlanes, TrainerShardTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "SharedMemory" : "Grpc";
                         });

}  // namespace
}  // namespace dp
