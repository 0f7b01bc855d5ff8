// The step protocol of dp-ps without the network: a step is applied once
// every micro-batch is in, whatever the arrival order; pushes are
// idempotent; waits end with the step; refused requests leave no trace.
#include "server/step_coordinator.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "common/job_failure.h"
#include "gtest/gtest.h"
#include "server/coordinator_mirror.h"
#include "tests/coordinator_harness.h"
#include "tests/same_state.h"

namespace dp {
namespace {

TEST(StepCoordinatorTest, AveragingIsIndependentOfArrivalOrder) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  std::vector<int> order = {0, 1, 2};
  std::vector<TrainingState> results;
  do {
    auto c = MakeTestCoordinator(l);
    for (int step = 0; step < 2; ++step) {
      for (int r : order) {
        ASSERT_TRUE(PushGradient(*c, r, step).ok());
      }
    }
    results.push_back(c->Snapshot());
  } while (std::next_permutation(order.begin(), order.end()));
  ASSERT_EQ(results.size(), 6u);
  EXPECT_EQ(results[0].step, 2);
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_TRUE(SameState(results[0], results[i])) << "permutation " << i;
  }
}

// Each push is added up the tree as soon as its sibling is in: with 3
// micro-batches ([0,2) and [2,3) under the root), micro-batch 2 waits
// alone, 0 waits for 1, and 1's arrival makes [0,2), then the root; the
// result is the one of summing after the last push (the arrival-order test
// above).
TEST(StepCoordinatorTest, SumsAreAddedUpTheTreeAsSoonAsTheirSiblingsAreIn) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  ASSERT_TRUE(PushGradient(*c, 2, 0).ok());
  EXPECT_EQ(SumBlocks(c->Observe()), (std::vector<Block>{{2, 1}}));
  ASSERT_TRUE(PushGradient(*c, 0, 0).ok());
  EXPECT_EQ(SumBlocks(c->Observe()), (std::vector<Block>{{0, 1}, {2, 1}}));
  EXPECT_TRUE(SameBits(c->Observe().sums[0].second, TestGradient(l, 0, 0)));
  EXPECT_EQ(c->Push(0, 0, 0, WireBytes(TestGradient(l, 1, 0)), 1.0f)->duplicate,
            true);
  EXPECT_TRUE(SameBits(c->Observe().sums[0].second, TestGradient(l, 0, 0)))
      << "a retry changed the sum";
  ASSERT_TRUE(PushGradient(*c, 1, 0).ok());
  EXPECT_TRUE(c->Observe().sums.empty()) << "the step is applied: a new sum";
  EXPECT_EQ(c->Status().step, 1);
}

TEST(StepCoordinatorTest, StepIsAppliedOnlyWhenAllRanksPushed) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  const TrainingState before = c->Snapshot();
  ASSERT_TRUE(PushGradient(*c, 0, 0).ok());
  ASSERT_TRUE(PushGradient(*c, 2, 0).ok());
  EXPECT_TRUE(SameState(before, c->Snapshot()));
  EXPECT_EQ(c->Status().pushed_ranks, (std::vector<int>{0, 2}));
  auto last = PushGradient(*c, 1, 0);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->step, 1);
  EXPECT_FALSE(SameBits(before.params, c->Snapshot().params));
}

TEST(StepCoordinatorTest, DuplicatePushIsAcknowledgedAndCountedOnce) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto once = MakeTestCoordinator(l);
  auto twice = MakeTestCoordinator(l);
  for (int r = 0; r < kTestWorld; ++r) {
    ASSERT_TRUE(PushGradient(*once, r, 0).ok());
    auto first = PushGradient(*twice, r, 0);
    ASSERT_TRUE(first.ok());
    EXPECT_FALSE(first->duplicate);
    // A retry, even one carrying other numbers, does not replace the first.
    auto retry = twice->Push(r, 0, 0, WireBytes(TestGradient(l, r, 9)), 1.0f);
    ASSERT_TRUE(retry.ok());
    EXPECT_TRUE(retry->duplicate);
  }
  EXPECT_TRUE(SameState(once->Snapshot(), twice->Snapshot()));
  // A retry of the step just applied (its answer was lost) is acknowledged.
  auto late = PushGradient(*twice, 0, 0);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->duplicate);
  EXPECT_EQ(late->step, 1);
  EXPECT_TRUE(SameState(once->Snapshot(), twice->Snapshot()));
}

TEST(StepCoordinatorTest, WaitCompletesWhenTheStepIsApplied) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  ASSERT_TRUE(PushGradient(*c, 0, 0).ok());
  int calls = 0;
  int64_t seen = -1;
  auto ticket =
      c->WaitForStep(0, 0, [&](const absl::Status& s, int64_t step, Block) {
        EXPECT_TRUE(s.ok());
        ++calls;
        seen = step;
      });
  ASSERT_TRUE(ticket.ok());
  EXPECT_FALSE(ticket->ready);
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(PushGradient(*c, 1, 0).ok());
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(PushGradient(*c, 2, 0).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 1);
  // Waiting for an applied step is ready at once, without a callback.
  auto again = c->WaitForStep(
      0, 0, [&](const absl::Status&, int64_t, Block) { ++calls; });
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->ready);
  EXPECT_EQ(calls, 1);
}

TEST(StepCoordinatorTest, CancelledWaitIsNeverCalledAndShutdownFailsWaits) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  ASSERT_TRUE(PushGradient(*c, 0, 0).ok());
  ASSERT_TRUE(PushGradient(*c, 1, 0).ok());
  int cancelled_calls = 0;
  absl::Status shutdown_status;
  auto a = c->WaitForStep(
      0, 0, [&](const absl::Status&, int64_t, Block) { ++cancelled_calls; });
  auto b = c->WaitForStep(1, 0, [&](const absl::Status& s, int64_t, Block) {
    shutdown_status = s;
  });
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(c->CancelWait(a->id));
  EXPECT_FALSE(c->CancelWait(a->id));
  c->Shutdown();
  EXPECT_EQ(cancelled_calls, 0);
  EXPECT_EQ(shutdown_status.code(), absl::StatusCode::kUnavailable);
}

TEST(StepCoordinatorTest, RejectedRequestsChangeNothing) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  // Reach step 2 with rank 0 already pushed for step 2.
  PushStep(*c, 0);
  PushStep(*c, 1);
  ASSERT_EQ(c->Status().step, 2);
  ASSERT_TRUE(PushGradient(*c, 0, 2).ok());
  // Rank 0 waits at the barrier, and an evaluation is on record: state that
  // a refused request could disturb.
  int64_t released_at = -1;
  auto wait = c->WaitForStep(
      0, 2,
      [&](const absl::Status&, int64_t step, Block) { released_at = step; });
  ASSERT_TRUE(wait.ok() && !wait->ready);
  ASSERT_TRUE(c->RecordEval(0, EvalReport{2, 1, 0.5, 0.7, 10, false}).ok());
  const StepCoordinator::ObservableState before = c->Observe();

  std::vector<float> nan_grad = TestGradient(l, 1, 2);
  nan_grad[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> inf_grad = TestGradient(l, 1, 2);
  inf_grad.back() = std::numeric_limits<float>::infinity();
  std::vector<float> short_grad(l.num_params() - 1, 0.0f);
  // Finite, but the rank sum or its square would overflow float.
  std::vector<float> huge_grad = TestGradient(l, 1, 2);
  huge_grad[5] = std::numeric_limits<float>::max();
  const std::string ok = WireBytes(TestGradient(l, 1, 2));
  const int64_t big = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* what;
    absl::Status status;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"wrong length", c->Push(1, 2, 0, WireBytes(short_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"offset", c->Push(1, 2, 4, ok, 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"NaN", c->Push(1, 2, 0, WireBytes(nan_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"Inf", c->Push(1, 2, 0, WireBytes(inf_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"huge finite value",
       c->Push(1, 2, 0, WireBytes(huge_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"pull range that overflows", c->Pull(0, big, big).status(),
       absl::StatusCode::kInvalidArgument},
      {"NaN loss",
       c->Push(1, 2, 0, ok, std::numeric_limits<float>::quiet_NaN()).status(),
       absl::StatusCode::kInvalidArgument},
      {"rank too large", c->Push(kTestWorld, 2, 0, ok, 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"negative rank", c->Push(-1, 2, 0, ok, 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"stale step", c->Push(1, 0, 0, ok, 1.0f).status(),
       absl::StatusCode::kAborted},
      {"future step", c->Push(1, 3, 0, ok, 1.0f).status(),
       absl::StatusCode::kAborted},
      {"future barrier",
       c->WaitForStep(1, 3, [](const absl::Status&, int64_t, Block) {})
           .status(),
       absl::StatusCode::kAborted},
      {"wrong model", c->Register(1, l.Fingerprint() + 1, kTestData).status(),
       absl::StatusCode::kFailedPrecondition},
      {"other data",
       c->Register(1, l.Fingerprint(), DataFingerprint{1000, 0x999}).status(),
       absl::StatusCode::kFailedPrecondition},
      {"bad eval", c->RecordEval(0, EvalReport{1, 1, 1.5, 0.1, 10, false}),
       absl::StatusCode::kInvalidArgument},
  };
  for (const Case& k : cases) {
    EXPECT_EQ(k.status.code(), k.code) << k.what << ": " << k.status;
    EXPECT_FALSE(k.status.message().empty()) << k.what;
  }
  // Leases included: a rank whose every request is refused must still be
  // reported missing.
  EXPECT_EQ(ObservableDifferences(before, c->Observe()), "");
  // A wait before the push is handed the rank's own block to compute.
  auto early = c->WaitForStep(1, 2, [](const absl::Status&, int64_t, Block) {
    ADD_FAILURE() << "a ready ticket's callback ran";
  });
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE(early->ready);
  EXPECT_EQ(early->work, (Block{1, 1}));
  // The step still completes normally with the valid pushes.
  ASSERT_TRUE(c->Push(1, 2, 0, ok, 1.0f).ok());
  ASSERT_TRUE(PushGradient(*c, 2, 2).ok());
  EXPECT_EQ(c->Snapshot().step, 3);
  EXPECT_EQ(released_at, 3);
}

// The job's failure reaches the waiting ranks and every later request.
TEST(StepCoordinatorTest, JobFailureFailsWaitersAndLaterRequests) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  ASSERT_TRUE(PushGradient(*c, 0, 0).ok());
  absl::Status waited;
  ASSERT_TRUE(c->WaitForStep(0, 0, [&](const absl::Status& s, int64_t, Block) {
                 waited = s;
               }).ok());
  c->Fail(JobFailedError("rank 2 was lost"));
  EXPECT_TRUE(IsJobFailed(waited)) << waited;
  EXPECT_TRUE(IsJobFailed(PushGradient(*c, 1, 0).status()));
  EXPECT_TRUE(IsJobFailed(c->Register(2, l.Fingerprint(), kTestData).status()));
  EXPECT_TRUE(IsJobFailed(c->Pull(1, 0, 0).status()));
}

// The comparison itself must see a change in each kind of state, or the
// test above could not fail.
TEST(StepCoordinatorTest, ObservableDifferencesSeesLeasesWaitersAndPushes) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  const StepCoordinator::ObservableState start = c->Observe();
  ASSERT_TRUE(c->Pull(1, 0, 0).ok());
  EXPECT_EQ(ObservableDifferences(start, c->Observe()), "leases");
  const StepCoordinator::ObservableState pulled = c->Observe();
  ASSERT_TRUE(PushGradient(*c, 2, 0).ok());
  EXPECT_EQ(ObservableDifferences(pulled, c->Observe()),
            "received pushes, losses, received sums, plan, leases");
  const StepCoordinator::ObservableState pushed = c->Observe();
  ASSERT_TRUE(
      c->WaitForStep(2, 0, [](const absl::Status&, int64_t, Block) {}).ok());
  EXPECT_EQ(ObservableDifferences(pushed, c->Observe()), "leases, waiters");
}

TEST(StepCoordinatorTest, WaitsOfOneRankAreBoundedOldestEvicted) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeTestCoordinator(l);
  ASSERT_TRUE(PushGradient(*c, 0, 0).ok());
  const int n = StepCoordinator::kMaxWaitsPerRank + 2;
  std::vector<absl::Status> results(n);
  std::vector<int> calls(n, 0);
  for (int i = 0; i < n; ++i) {
    auto t =
        c->WaitForStep(0, 0, [&, i](const absl::Status& s, int64_t, Block) {
          results[i] = s;
          ++calls[i];
        });
    ASSERT_TRUE(t.ok());
    EXPECT_FALSE(t->ready);
  }
  // The two oldest were evicted, at once, with ABORTED (the worker re-syncs).
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(calls[i], 1);
    EXPECT_EQ(results[i].code(), absl::StatusCode::kAborted) << results[i];
  }
  for (int i = 2; i < n; ++i) EXPECT_EQ(calls[i], 0);
  ASSERT_TRUE(PushGradient(*c, 1, 0).ok());
  ASSERT_TRUE(PushGradient(*c, 2, 0).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(calls[i], 1);
  for (int i = 2; i < n; ++i) EXPECT_TRUE(results[i].ok()) << results[i];
}

TEST(StepCoordinatorTest, UnregisteredRankIsFailedPrecondition) {
  CoordinatorSetup only_rank_0;
  only_rank_0.registered = 1;
  auto c = MakeTestCoordinator(ModelLayout::Mlp({5, 7, 3}), only_rank_0);
  auto pushed = PushGradient(*c, 1, 0);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pushed.status().message().find("rank 1"), std::string::npos);
}

TEST(StepCoordinatorTest, DataTooSmallForOneGlobalBatchIsRefusedAtRegister) {
  CoordinatorSetup nobody;
  nobody.registered = 0;
  auto c = MakeTestCoordinator(ModelLayout::Mlp({5, 7, 3}), nobody);
  auto r = RegisterRank(*c, 0, DataFingerprint{5, 1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  // A later worker with enough data can still define the job.
  EXPECT_TRUE(RegisterRank(*c, 0).ok());
  EXPECT_EQ(c->Status().total_steps, 1000 / (kTestWorld * 4));
}

}  // namespace
}  // namespace dp
