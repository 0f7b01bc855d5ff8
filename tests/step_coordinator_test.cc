// The step protocol of dp-ps without the network: rank-ordered averaging,
// idempotent pushes, rejected requests leave no trace.
#include "server/coordinator_mirror.h"
#include "server/step_coordinator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_failure.h"
#include "gtest/gtest.h"
#include "server/adam.h"
#include "tests/same_state.h"

namespace dp {
namespace {

constexpr int kWorld = 3;

JobConfig SmallJob() {
  JobConfig c;
  c.schedule.world_size = kWorld;
  c.schedule.batch_size = 4;
  c.schedule.epochs = 1;
  c.dataset = "synthetic";
  return c;
}

const DataFingerprint kData{1000, 0x1234};

std::unique_ptr<StepCoordinator> MakeCoordinator(const ModelLayout& layout) {
  TrainingState s;
  s.params = InitParams(layout, 1);
  auto c = std::make_unique<StepCoordinator>(layout, SmallJob(), s);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(c->Register(r, layout.Fingerprint(), kData).ok());
  }
  return c;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

// Gradients whose rank-ordered float sum differs from other orders: large
// and small magnitudes mixed, so (a+b)+c != (a+c)+b in float.
std::vector<float> Gradient(const ModelLayout& l, int rank, int step) {
  std::vector<float> g(l.num_params());
  for (int64_t i = 0; i < l.num_params(); ++i) {
    const float scale = rank == 0 ? 1e8f : 1.0f;
    g[i] = scale * std::sin(0.37f * i + rank * 1.3f + step * 0.11f) + rank;
  }
  return g;
}

// The float32 values of pulled weights.
std::vector<float> Values(const StepCoordinator::PulledWeights& w) {
  std::vector<float> out(w.bytes.size() / BytesPerValue(w.encoding));
  Decode(w.encoding, w.bytes.data(), out.size(), out.data());
  return out;
}

TEST(StepCoordinatorTest, PulledWeightsAreASnapshotSharedUntilTheNextUpdate) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  auto first = c->Pull(0, 0, 0);
  auto again = c->Pull(1, 0, 0);
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_EQ(first->lease.get(), again->lease.get())
      << "one copy serves every rank";
  EXPECT_EQ(first->encoding, Encoding::kF32);
  const std::vector<float> before = Values(*first);
  EXPECT_TRUE(SameBits(before, c->Snapshot().params));
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(c->Push(r, 0, 0, Bytes(Gradient(l, r, 0)), 1.0f).ok());
  }
  // A response still being sent keeps the weights it was given.
  EXPECT_TRUE(SameBits(before, Values(*first)));
  auto next = c->Pull(0, 2, 3);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->step, 1);
  EXPECT_NE(next->lease.get(), first->lease.get())
      << "a held snapshot is not reused";
  const std::vector<float> now = c->Snapshot().params;
  EXPECT_FALSE(SameBits(before, now));
  EXPECT_TRUE(SameBits(Values(*next),
                       std::vector<float>(now.begin() + 2, now.begin() + 5)));
  // Released snapshots are reused: serving many steps allocates no more.
  const void* held = next->lease.get();
  first = again = next = absl::InternalError("released");
  std::set<const void*> buffers{held};
  for (int step = 1; step < 6; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(c->Push(r, step, 0, Bytes(Gradient(l, r, step)), 1.0f).ok());
    }
    auto w = c->Pull(0, 0, 0);
    ASSERT_TRUE(w.ok());
    buffers.insert(w->lease.get());
  }
  EXPECT_LE(buffers.size(), 2u);
}

// WithCurrentWeights hands out the params themselves, with no snapshot;
// Pull still makes one, once a version, when it is first asked.
TEST(StepCoordinatorTest, TheTimeOfReadingPushesAndUsingTheWeightsIsCounted) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  EXPECT_EQ(c->Status().times.read_time, absl::ZeroDuration());
  EXPECT_EQ(c->Status().times.use_time, absl::ZeroDuration());
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(c->Push(r, 0, 0, Bytes(Gradient(l, r, 0)), 1.0f).ok());
  }
  const absl::Duration read = c->Status().times.read_time;
  EXPECT_GT(read, absl::ZeroDuration());
  // A refused push was read too: its time counts.
  EXPECT_FALSE(c->Push(0, 5, 0, Bytes(Gradient(l, 0, 5)), 1.0f).ok());
  EXPECT_GT(c->Status().times.read_time, read);
  const absl::Duration pause = absl::Milliseconds(2);
  ASSERT_TRUE(c->WithCurrentWeights(0, [&](int64_t, absl::Span<const float>) {
                 absl::SleepFor(pause);
               }).ok());
  EXPECT_GE(c->Status().times.use_time, pause);
}

TEST(StepCoordinatorTest, CurrentWeightsAreHandedOutWithoutASnapshot) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(c->Push(r, step, 0, Bytes(Gradient(l, r, step)), 1.0f).ok());
    }
    for (int r = 0; r < kWorld; ++r) {
      std::vector<float> seen;
      int64_t seen_step = -1;
      auto step_now = c->WithCurrentWeights(
          r, [&](int64_t s, absl::Span<const float> params) {
            seen_step = s;
            seen.assign(params.begin(), params.end());
          });
      ASSERT_TRUE(step_now.ok()) << step_now.status();
      EXPECT_EQ(step_now->step, step + 1);
      EXPECT_EQ(seen_step, step + 1);
      EXPECT_TRUE(SameBits(seen, c->Snapshot().params));
    }
  }
  EXPECT_EQ(c->Status().snapshots, 0);
  bool called = false;
  EXPECT_EQ(
      c->WithCurrentWeights(
           kWorld, [&](int64_t, absl::Span<const float>) { called = true; })
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
  ASSERT_TRUE(c->Pull(0, 0, 0).ok());
  ASSERT_TRUE(c->Pull(1, 0, 0).ok());
  EXPECT_EQ(c->Status().snapshots, 1);
}

TEST(StepCoordinatorTest, Bf16WeightsAreTheFloat32WeightsRounded) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  TrainingState s;
  s.params = InitParams(l, 1);
  JobConfig config = SmallJob();
  config.weight_encoding = Encoding::kBf16;
  StepCoordinator c(l, config, s);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(c.Register(r, l.Fingerprint(), kData).ok());
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(c.Push(r, 0, 0, Bytes(Gradient(l, r, 0)), 1.0f).ok());
  }
  auto w = c.Pull(0, 1, 4);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->encoding, Encoding::kBf16);
  ASSERT_EQ(w->bytes.size(), 4u * 2);
  // dp-ps keeps float32: only what it sends is rounded.
  const std::vector<float> kept = c.Snapshot().params;
  std::string expected(4 * 2, '\0');
  Encode(Encoding::kBf16, kept.data() + 1, 4, expected.data());
  EXPECT_EQ(std::string(w->bytes), expected);
  EXPECT_FALSE(SameBits(
      Values(*w), std::vector<float>(kept.begin() + 1, kept.begin() + 5)));
}

TEST(StepCoordinatorTest, AveragingIsIndependentOfArrivalOrder) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  std::vector<int> order = {0, 1, 2};
  std::vector<TrainingState> results;
  do {
    auto c = MakeCoordinator(l);
    for (int step = 0; step < 2; ++step) {
      for (int r : order) {
        ASSERT_TRUE(
            c->Push(r, step, 0, Bytes(Gradient(l, r, step)), 1.0f).ok());
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

// The blocks of the sum that are in, as Observe() shows them.
std::vector<Block> SumBlocks(const StepCoordinator::ObservableState& o) {
  std::vector<Block> blocks;
  for (const auto& [block, values] : o.sums) blocks.push_back(block);
  return blocks;
}

// Each push is added up the tree as soon as its sibling is in: with 3
// micro-batches ([0,2) and [2,3) under the root), micro-batch 2 waits
// alone, 0 waits for 1, and 1's arrival makes [0,2), then the root; the
// result is the one of summing after the last push (the arrival-order test
// above).
TEST(StepCoordinatorTest, SumsAreAddedUpTheTreeAsSoonAsTheirSiblingsAreIn) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  ASSERT_TRUE(c->Push(2, 0, 0, Bytes(Gradient(l, 2, 0)), 1.0f).ok());
  EXPECT_EQ(SumBlocks(c->Observe()), (std::vector<Block>{{2, 1}}));
  ASSERT_TRUE(c->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f).ok());
  EXPECT_EQ(SumBlocks(c->Observe()), (std::vector<Block>{{0, 1}, {2, 1}}));
  EXPECT_TRUE(SameBits(c->Observe().sums[0].second, Gradient(l, 0, 0)));
  EXPECT_EQ(c->Push(0, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f)->duplicate, true);
  EXPECT_TRUE(SameBits(c->Observe().sums[0].second, Gradient(l, 0, 0)))
      << "a retry changed the sum";
  ASSERT_TRUE(c->Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f).ok());
  EXPECT_TRUE(c->Observe().sums.empty()) << "the step is applied: a new sum";
  EXPECT_EQ(c->Status().step, 1);
}

TEST(StepCoordinatorTest, StepIsAppliedOnlyWhenAllRanksPushed) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  const TrainingState before = c->Snapshot();
  ASSERT_TRUE(c->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f).ok());
  ASSERT_TRUE(c->Push(2, 0, 0, Bytes(Gradient(l, 2, 0)), 1.0f).ok());
  EXPECT_TRUE(SameState(before, c->Snapshot()));
  EXPECT_EQ(c->Status().pushed_ranks, (std::vector<int>{0, 2}));
  auto last = c->Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->step, 1);
  EXPECT_FALSE(SameBits(before.params, c->Snapshot().params));
}

TEST(StepCoordinatorTest, DuplicatePushIsAcknowledgedAndCountedOnce) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto once = MakeCoordinator(l);
  auto twice = MakeCoordinator(l);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(once->Push(r, 0, 0, Bytes(Gradient(l, r, 0)), 1.0f).ok());
    auto first = twice->Push(r, 0, 0, Bytes(Gradient(l, r, 0)), 1.0f);
    ASSERT_TRUE(first.ok());
    EXPECT_FALSE(first->duplicate);
    // A retry, even one carrying other numbers, does not replace the first.
    auto retry = twice->Push(r, 0, 0, Bytes(Gradient(l, r, 9)), 1.0f);
    ASSERT_TRUE(retry.ok());
    EXPECT_TRUE(retry->duplicate);
  }
  EXPECT_TRUE(SameState(once->Snapshot(), twice->Snapshot()));
  // A retry of the step just applied (its answer was lost) is acknowledged.
  auto late = twice->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->duplicate);
  EXPECT_EQ(late->step, 1);
  EXPECT_TRUE(SameState(once->Snapshot(), twice->Snapshot()));
}

TEST(StepCoordinatorTest, WaitCompletesWhenTheStepIsApplied) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  ASSERT_TRUE(c->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f).ok());
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
  ASSERT_TRUE(c->Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f).ok());
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(c->Push(2, 0, 0, Bytes(Gradient(l, 2, 0)), 1.0f).ok());
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
  auto c = MakeCoordinator(l);
  ASSERT_TRUE(c->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f).ok());
  ASSERT_TRUE(c->Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f).ok());
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
  auto c = MakeCoordinator(l);
  // Reach step 2 with rank 0 already pushed for step 2.
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(c->Push(r, step, 0, Bytes(Gradient(l, r, step)), 1.0f).ok());
    }
  }
  ASSERT_TRUE(c->Push(0, 2, 0, Bytes(Gradient(l, 0, 2)), 1.0f).ok());
  // Rank 0 waits at the barrier, and an evaluation is on record: state that
  // a refused request could disturb.
  int64_t released_at = -1;
  auto wait = c->WaitForStep(
      0, 2,
      [&](const absl::Status&, int64_t step, Block) { released_at = step; });
  ASSERT_TRUE(wait.ok() && !wait->ready);
  ASSERT_TRUE(c->RecordEval(0, EvalReport{2, 1, 0.5, 0.7, 10, false}).ok());
  const StepCoordinator::ObservableState before = c->Observe();

  std::vector<float> nan_grad = Gradient(l, 1, 2);
  nan_grad[3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> inf_grad = Gradient(l, 1, 2);
  inf_grad.back() = std::numeric_limits<float>::infinity();
  std::vector<float> short_grad(l.num_params() - 1, 0.0f);
  // Finite, but the rank sum or its square would overflow float.
  std::vector<float> huge_grad = Gradient(l, 1, 2);
  huge_grad[5] = std::numeric_limits<float>::max();
  const std::string ok = Bytes(Gradient(l, 1, 2));
  const int64_t big = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* what;
    absl::Status status;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {"wrong length", c->Push(1, 2, 0, Bytes(short_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"offset", c->Push(1, 2, 4, ok, 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"NaN", c->Push(1, 2, 0, Bytes(nan_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"Inf", c->Push(1, 2, 0, Bytes(inf_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"huge finite value", c->Push(1, 2, 0, Bytes(huge_grad), 1.0f).status(),
       absl::StatusCode::kInvalidArgument},
      {"pull range that overflows", c->Pull(0, big, big).status(),
       absl::StatusCode::kInvalidArgument},
      {"NaN loss",
       c->Push(1, 2, 0, ok, std::numeric_limits<float>::quiet_NaN()).status(),
       absl::StatusCode::kInvalidArgument},
      {"rank too large", c->Push(kWorld, 2, 0, ok, 1.0f).status(),
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
      {"wrong model", c->Register(1, l.Fingerprint() + 1, kData).status(),
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
  ASSERT_TRUE(c->Push(2, 2, 0, Bytes(Gradient(l, 2, 2)), 1.0f).ok());
  EXPECT_EQ(c->Snapshot().step, 3);
  EXPECT_EQ(released_at, 3);
}

// The job's failure reaches the waiting ranks and every later request.
TEST(StepCoordinatorTest, JobFailureFailsWaitersAndLaterRequests) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  ASSERT_TRUE(c->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f).ok());
  absl::Status waited;
  ASSERT_TRUE(c->WaitForStep(0, 0, [&](const absl::Status& s, int64_t, Block) {
                 waited = s;
               }).ok());
  c->Fail(JobFailedError("rank 2 was lost"));
  EXPECT_TRUE(IsJobFailed(waited)) << waited;
  EXPECT_TRUE(
      IsJobFailed(c->Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f).status()));
  EXPECT_TRUE(IsJobFailed(c->Register(2, l.Fingerprint(), kData).status()));
  EXPECT_TRUE(IsJobFailed(c->Pull(1, 0, 0).status()));
}

// The comparison itself must see a change in each kind of state, or the
// test above could not fail.
TEST(StepCoordinatorTest, ObservableDifferencesSeesLeasesWaitersAndPushes) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  const StepCoordinator::ObservableState start = c->Observe();
  ASSERT_TRUE(c->Pull(1, 0, 0).ok());
  EXPECT_EQ(ObservableDifferences(start, c->Observe()), "leases");
  const StepCoordinator::ObservableState pulled = c->Observe();
  ASSERT_TRUE(c->Push(2, 0, 0, Bytes(Gradient(l, 2, 0)), 1.0f).ok());
  EXPECT_EQ(ObservableDifferences(pulled, c->Observe()),
            "received pushes, losses, received sums, plan, leases");
  const StepCoordinator::ObservableState pushed = c->Observe();
  ASSERT_TRUE(
      c->WaitForStep(2, 0, [](const absl::Status&, int64_t, Block) {}).ok());
  EXPECT_EQ(ObservableDifferences(pushed, c->Observe()), "leases, waiters");
}

TEST(StepCoordinatorTest, Bf16GradientsAreDecodedAndOtherEncodingsRefused) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  JobConfig config = SmallJob();
  config.grad_encoding = Encoding::kBf16;
  TrainingState s;
  s.params = InitParams(l, 1);
  StepCoordinator bf16(l, config, s);
  auto f32 = MakeCoordinator(l);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(bf16.Register(r, l.Fingerprint(), kData).ok());
  }
  // Values exact in bf16: both jobs must take the identical step.
  std::vector<float> g(l.num_params());
  for (size_t i = 0; i < g.size(); ++i) g[i] = (int(i % 7) - 3) * 0.25f;
  std::string half(g.size() * 2, '\0');
  Encode(Encoding::kBf16, g.data(), g.size(), half.data());
  EXPECT_EQ(bf16.Push(0, 0, 0, Bytes(g), 1.0f, Encoding::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f32->Push(0, 0, 0, half, 1.0f, Encoding::kBf16).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string nan_half = half;
  nan_half[2 * 10 + 1] = static_cast<char>(0x7f);
  nan_half[2 * 10] = static_cast<char>(0xc0);
  auto nan = bf16.Push(0, 0, 0, nan_half, 1.0f, Encoding::kBf16);
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nan.status().message().find("index 10"), std::string::npos)
      << nan.status();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(bf16.Push(r, 0, 0, half, 1.0f, Encoding::kBf16).ok());
    ASSERT_TRUE(f32->Push(r, 0, 0, Bytes(g), 1.0f).ok());
  }
  EXPECT_TRUE(SameState(bf16.Snapshot(), f32->Snapshot()));
}

// The validator leaves a gradient's values alone: they are read once, here,
// as they are decoded into the rank's buffer.
TEST(StepCoordinatorTest, GradientValuesAreCheckedAsTheyAreDecoded) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  const int64_t last = l.num_params() - 1;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::max(), -2 * kMaxAbsGradient}) {
    for (int64_t at : {int64_t{0}, last}) {
      auto c = MakeCoordinator(l);
      std::vector<float> g = Gradient(l, 0, 0);
      g[at] = bad;
      const auto before = c->Observe();
      auto pushed = c->Push(0, 0, 0, Bytes(g), 1.0f);
      EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument)
          << bad << " at " << at;
      EXPECT_NE(pushed.status().message().find(absl::StrCat("index ", at)),
                std::string::npos)
          << pushed.status();
      EXPECT_EQ(ObservableDifferences(before, c->Observe()), "");
    }
  }
  auto c = MakeCoordinator(l);
  std::vector<float> g = Gradient(l, 0, 0);
  g[last] = -kMaxAbsGradient;
  EXPECT_TRUE(c->Push(0, 0, 0, Bytes(g), 1.0f).ok());
}

TEST(StepCoordinatorTest, LargestAcceptedGradientsKeepTheStateFinite) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  for (int step = 0; step < 20; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      // Alternating signs make m swing between the extremes.
      std::vector<float> g(l.num_params(),
                           (step + r) % 2 ? kMaxAbsGradient : -kMaxAbsGradient);
      ASSERT_TRUE(c->Push(r, step, 0, Bytes(g), 1e15f).ok());
    }
  }
  const TrainingState s = c->Snapshot();
  ASSERT_EQ(s.step, 20);
  for (const auto* x : {&s.params, &s.m, &s.v}) {
    EXPECT_TRUE(std::all_of(x->begin(), x->end(),
                            [](float f) { return std::isfinite(f); }));
  }
}

TEST(StepCoordinatorTest, WaitsOfOneRankAreBoundedOldestEvicted) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  auto c = MakeCoordinator(l);
  ASSERT_TRUE(c->Push(0, 0, 0, Bytes(Gradient(l, 0, 0)), 1.0f).ok());
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
  ASSERT_TRUE(c->Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f).ok());
  ASSERT_TRUE(c->Push(2, 0, 0, Bytes(Gradient(l, 2, 0)), 1.0f).ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(calls[i], 1);
  for (int i = 2; i < n; ++i) EXPECT_TRUE(results[i].ok()) << results[i];
}

TEST(StepCoordinatorTest, UnregisteredRankIsFailedPrecondition) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  TrainingState s;
  s.params = InitParams(l, 1);
  StepCoordinator c(l, SmallJob(), s);
  ASSERT_TRUE(c.Register(0, l.Fingerprint(), kData).ok());
  auto pushed = c.Push(1, 0, 0, Bytes(Gradient(l, 1, 0)), 1.0f);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pushed.status().message().find("rank 1"), std::string::npos);
}

TEST(StepCoordinatorTest, DataTooSmallForOneGlobalBatchIsRefusedAtRegister) {
  const ModelLayout l = ModelLayout::Mlp({5, 7, 3});
  TrainingState s;
  s.params = InitParams(l, 1);
  StepCoordinator c(l, SmallJob(), s);
  auto r = c.Register(0, l.Fingerprint(), DataFingerprint{5, 1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  // A later worker with enough data can still define the job.
  EXPECT_TRUE(c.Register(0, l.Fingerprint(), kData).ok());
  EXPECT_EQ(c.Status().total_steps, 1000 / (kWorld * 4));
}

// A kWorld job of `layout` with gradients encoded as `e`, its update on
// `update_threads` threads, every rank registered.
std::unique_ptr<StepCoordinator> MakeCoordinator(const ModelLayout& layout,
                                                 Encoding e,
                                                 int update_threads) {
  JobConfig config = SmallJob();
  config.grad_encoding = e;
  TrainingState s;
  s.params = InitParams(layout, 1);
  auto c = std::make_unique<StepCoordinator>(layout, config, s, update_threads);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(c->Register(r, layout.Fingerprint(), kData).ok());
  }
  return c;
}

// `g` as it travels in encoding `e`.
std::string Wire(Encoding e, const std::vector<float>& g) {
  std::string bytes(g.size() * BytesPerValue(e), '\0');
  Encode(e, g.data(), g.size(), bytes.data());
  return bytes;
}

// What dp-ps reads from Wire(e, g).
std::vector<float> AsRead(Encoding e, const std::vector<float>& g) {
  std::vector<float> read(g.size());
  Decode(e, Wire(e, g).data(), g.size(), read.data());
  return read;
}

// The gradient of the next rank to fold is added to the rank sum as it is
// read, with those of the ranks after it that came early (kept until
// then): every arrival order gives the bits of the rank-ordered sum, in
// either encoding, with an update pool.
TEST(StepCoordinatorTest, EveryArrivalOrderGivesTheBitsOfTheRankOrderedSum) {
  const ModelLayout l = ModelLayout::Mlp({40, 50, 10});  // five blocks
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    SCOPED_TRACE(EncodingName(e));
    std::vector<int> order = {0, 1, 2};
    std::optional<TrainingState> in_rank_order;
    do {
      auto c = MakeCoordinator(l, e, 3);
      for (int step = 0; step < 3; ++step) {
        for (int r : order) {
          ASSERT_TRUE(
              c->Push(r, step, 0, Wire(e, Gradient(l, r, step)), 1.0f, e).ok());
        }
      }
      EXPECT_EQ(c->Snapshot().step, 3);
      if (!in_rank_order.has_value()) {
        in_rank_order = c->Snapshot();
      } else {
        EXPECT_TRUE(SameState(*in_rank_order, c->Snapshot()))
            << order[0] << order[1] << order[2];
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

// What Observe() shows as the blocks come: a block whose sibling is not in
// keeps its sum (as read: bf16 decoded); the one that completes a sibling
// pair adds itself to it, and up the tree.
TEST(StepCoordinatorTest, SumsWaitForTheirSiblingsAndAreAddedWithThem) {
  const ModelLayout l = ModelLayout::Mlp({40, 50, 10});
  const Encoding e = Encoding::kBf16;
  auto c = MakeCoordinator(l, e, 3);
  std::vector<std::vector<float>> read;
  for (int r = 0; r < kWorld; ++r) read.push_back(AsRead(e, Gradient(l, r, 0)));
  ASSERT_TRUE(c->Push(2, 0, 0, Wire(e, Gradient(l, 2, 0)), 1.0f, e).ok());
  auto o = c->Observe();
  ASSERT_EQ(SumBlocks(o), (std::vector<Block>{{2, 1}}));
  EXPECT_TRUE(SameBits(o.sums[0].second, read[2]));
  ASSERT_TRUE(c->Push(0, 0, 0, Wire(e, Gradient(l, 0, 0)), 1.0f, e).ok());
  o = c->Observe();
  ASSERT_EQ(SumBlocks(o), (std::vector<Block>{{0, 1}, {2, 1}}))
      << "micro-batch 0 waits for 1";
  EXPECT_TRUE(SameBits(o.sums[0].second, read[0]));
  EXPECT_TRUE(SameBits(o.sums[1].second, read[2]));
  // Micro-batch 1 makes [0,2) and the root, and the step is applied: the
  // same state as the sum made one push at a time.
  auto reference = MakeCoordinator(l, e, 1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(
        reference->Push(r, 0, 0, Wire(e, Gradient(l, r, 0)), 1.0f, e).ok());
  }
  ASSERT_TRUE(c->Push(1, 0, 0, Wire(e, Gradient(l, 1, 0)), 1.0f, e).ok());
  EXPECT_TRUE(c->Observe().sums.empty()) << "the step is applied: a new sum";
  EXPECT_TRUE(SameState(c->Snapshot(), reference->Snapshot()));
}

// A bad value anywhere in the gradient of the next rank to fold - rank 0
// or a later one, with a kept gradient after it - is refused like one in a
// gradient that is kept: the error names the rank, the step, the value and
// its index, and the sum, the kept gradients and everything else are as
// before.
TEST(StepCoordinatorTest, ABadValueInAGradientAddedAsItIsReadChangesNothing) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              -2 * kMaxAbsGradient};
  for (Encoding e : {Encoding::kF32, Encoding::kBf16}) {
    for (int threads : {1, 3}) {
      for (int bad_rank : {0, 1}) {
        SCOPED_TRACE(testing::Message() << EncodingName(e) << ", " << threads
                                        << " threads, rank " << bad_rank);
        const ModelLayout l = threads == 1 ? ModelLayout::Mlp({5, 7, 3})
                                           : ModelLayout::Mlp({40, 50, 10});
        auto c = MakeCoordinator(l, e, threads);
        auto clean = MakeCoordinator(l, e, threads);
        // Rank 2 came early: its gradient is kept.
        for (int r : {bad_rank == 0 ? 1 : 0, 2}) {
          for (auto* k : {c.get(), clean.get()}) {
            ASSERT_TRUE(
                k->Push(r, 0, 0, Wire(e, Gradient(l, r, 0)), 1.0f, e).ok());
          }
        }
        const auto before = c->Observe();
        for (int64_t at = 0; at < l.num_params(); ++at) {
          std::vector<float> g = Gradient(l, bad_rank, 0);
          g[at] = bad_values[at % 4];
          const std::string wire = Wire(e, g);
          const auto pushed = c->Push(bad_rank, 0, 0, wire, 1.0f, e);
          ASSERT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument)
              << "at " << at << ": " << pushed.status();
          const std::string message(pushed.status().message());
          float read;
          Decode(e, wire.data() + at * BytesPerValue(e), 1, &read);
          for (const std::string& part :
               {absl::StrCat("rank ", bad_rank, " "), std::string("step 0 "),
                absl::StrFormat("(%g, limit", read),
                absl::StrCat("index ", at)}) {
            ASSERT_NE(message.find(part), std::string::npos)
                << "no '" << part << "' in: " << message;
          }
          ASSERT_EQ(ObservableDifferences(before, c->Observe()), "")
              << "at " << at;
        }
        for (auto* k : {c.get(), clean.get()}) {
          ASSERT_TRUE(k->Push(bad_rank, 0, 0, Wire(e, Gradient(l, bad_rank, 0)),
                              1.0f, e)
                          .ok());
        }
        EXPECT_EQ(c->Snapshot().step, 1);
        EXPECT_TRUE(SameState(c->Snapshot(), clean->Snapshot()));
      }
    }
  }
}

}  // namespace
}  // namespace dp

namespace dp {
namespace {

// Coordinators of `shards` shards of `layout`, each with its range of the
// same initial state, registered like MakeCoordinator's.
std::vector<std::unique_ptr<StepCoordinator>> MakeShards(
    const ModelLayout& layout, int shards) {
  const std::vector<float> all = InitParams(layout, 1);
  std::vector<std::unique_ptr<StepCoordinator>> out;
  for (int k = 0; k < shards; ++k) {
    ShardSpec spec;
    EXPECT_TRUE(MakeShardSpec(layout, shards, k, &spec).ok());
    TrainingState s;
    s.params.assign(all.begin() + spec.range.offset,
                    all.begin() + spec.range.end());
    out.push_back(
        std::make_unique<StepCoordinator>(layout, SmallJob(), s, 1, spec));
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(out.back()->Register(r, layout.Fingerprint(), kData).ok());
    }
  }
  return out;
}

// The bytes of rank's gradient of `step`, cut to `range`.
std::string GradientBytes(const ModelLayout& layout, int rank, int step,
                          ParamRange range) {
  const std::vector<float> g = Gradient(layout, rank, step);
  return Bytes(
      std::vector<float>(g.begin() + range.offset, g.begin() + range.end()));
}

// Every rank's gradient of `step`, cut to `range`, pushed to `c`.
void PushStep(StepCoordinator& c, const ModelLayout& layout, int step,
              ParamRange range) {
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(c.Push(r, step, range.offset,
                       GradientBytes(layout, r, step, range), 1.0f)
                    .ok());
  }
}

TEST(ShardedCoordinatorTest, ShardsComputeTheWholeVectorsUpdateToTheBit) {
  const ModelLayout layout = ModelLayout::Mlp({40, 30, 10});
  auto whole = MakeCoordinator(layout);
  auto shards = MakeShards(layout, 3);
  for (int step = 0; step < 5; ++step) {
    PushStep(*whole, layout, step, ParamRange{0, layout.num_params()});
    for (auto& s : shards) PushStep(*s, layout, step, s->shard().range);
  }
  const TrainingState w = whole->Snapshot();
  std::vector<float> params, m, v;
  for (auto& s : shards) {
    const TrainingState t = s->Snapshot();
    EXPECT_EQ(t.step, w.step);
    params.insert(params.end(), t.params.begin(), t.params.end());
    m.insert(m.end(), t.m.begin(), t.m.end());
    v.insert(v.end(), t.v.begin(), t.v.end());
  }
  EXPECT_TRUE(SameBits(params, w.params));
  EXPECT_TRUE(SameBits(m, w.m));
  EXPECT_TRUE(SameBits(v, w.v));
}

TEST(ShardedCoordinatorTest, RangesOutsideTheShardAreRefusedChangingNothing) {
  const ModelLayout layout = ModelLayout::Mlp({40, 30, 10});
  auto shards = MakeShards(layout, 2);
  StepCoordinator& second = *shards[1];
  const ParamRange mine = second.shard().range;
  const auto before = second.Observe();
  // The whole vector, the first shard's range, a range across the cut.
  const std::vector<float> g = Gradient(layout, 0, 0);
  EXPECT_EQ(second.Push(0, 0, 0, Bytes(g), 1.0f).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.Push(0, 0, 0, Bytes(std::vector<float>(mine.length)), 1.0f)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.Pull(0, mine.offset - 1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.Pull(0, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A pull of the range: its values, length 0 meaning to its end.
  auto pulled = second.Pull(0, mine.offset, 0);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(Values(*pulled).size(), static_cast<size_t>(mine.length));
  auto observed = second.Observe();
  observed.last_seen = before.last_seen;  // the accepted pull renewed it
  EXPECT_EQ(ObservableDifferences(before, observed), "");
}

// Errors name a value by its index in the whole vector, whether the
// gradient is kept (rank 0) or added to the sum as it is read (rank 1).
TEST(ShardedCoordinatorTest, ABadValueIsNamedByItsIndexInTheWholeVector) {
  const ModelLayout layout = ModelLayout::Mlp({40, 30, 10});
  auto shards = MakeShards(layout, 2);
  StepCoordinator& c = *shards[1];
  const ParamRange range = c.shard().range;
  for (int rank : {0, 1}) {
    const std::vector<float> g = Gradient(layout, rank, 0);
    std::vector<float> mine(g.begin() + range.offset, g.begin() + range.end());
    mine[5] = std::numeric_limits<float>::quiet_NaN();
    const auto before = c.Observe();
    const absl::Status s =
        c.Push(rank, 0, range.offset, Bytes(mine), 1.0f).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(absl::StrCat("index ", range.offset + 5)),
              std::string::npos)
        << s;
    EXPECT_EQ(ObservableDifferences(before, c.Observe()), "");
    ASSERT_TRUE(c.Push(rank, 0, range.offset,
                       GradientBytes(layout, rank, 0, range), 1.0f)
                    .ok());
  }
}

TEST(ShardedCoordinatorTest, TheVersionBeforeIsServedAfterAnUpdate) {
  const ModelLayout layout = ModelLayout::Mlp({40, 30, 10});
  auto shards = MakeShards(layout, 2);
  StepCoordinator& c = *shards[0];
  const ParamRange range = c.shard().range;
  EXPECT_FALSE(c.Status().holds_previous);
  EXPECT_EQ(c.Pull(0, range.offset, 0, int64_t{-1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::vector<float> v0 = Values(*c.Pull(0, range.offset, 0));
  PushStep(c, layout, 0, range);
  ASSERT_TRUE(c.Status().holds_previous);
  auto old = c.Pull(0, range.offset, 0, int64_t{0});
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->step, 0);
  EXPECT_TRUE(SameBits(Values(*old), v0));
  auto now = c.Pull(0, range.offset, 0, int64_t{1});
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->step, 1);
  EXPECT_FALSE(SameBits(Values(*now), v0));
  EXPECT_EQ(c.Pull(0, range.offset, 0, int64_t{2}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ShardedCoordinatorTest, RewindRestoresAStateAndEndsTheWaits) {
  const ModelLayout layout = ModelLayout::Mlp({40, 30, 10});
  auto shards = MakeShards(layout, 2);
  StepCoordinator& c = *shards[1];
  const ParamRange range = c.shard().range;
  const TrainingState at0 = c.Snapshot();
  PushStep(c, layout, 0, range);
  PushStep(c, layout, 1, range);
  // Rank 0 pushed step 2 and waits.
  ASSERT_TRUE(
      c.Push(0, 2, range.offset, GradientBytes(layout, 0, 2, range), 1.0f)
          .ok());
  absl::Status waited;
  auto ticket = c.WaitForStep(
      0, 2, [&](const absl::Status& s, int64_t, Block) { waited = s; });
  ASSERT_TRUE(ticket.ok() && !ticket->ready);

  // A rollback decided on another generation changes nothing.
  const uint64_t generation = c.Status().generation;
  const auto before = c.Observe();
  EXPECT_EQ(c.Rewind(generation + 1, at0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ObservableDifferences(before, c.Observe()), "");

  ASSERT_TRUE(c.Rewind(generation, at0).ok());
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted) << waited;
  EXPECT_TRUE(SameState(c.Snapshot(), at0));
  const CoordinatorStatus after = c.Status();
  EXPECT_NE(after.generation, generation);
  EXPECT_FALSE(after.holds_previous);
  EXPECT_TRUE(after.pushed_ranks.empty());
  // The steps again give the same state as the first time.
  PushStep(c, layout, 0, range);
  EXPECT_EQ(c.Status().step, 1);
}

}  // namespace
}  // namespace dp
