// The elastic step protocol without the network: any rank may push any
// block, lost ranks' blocks go to the others, joiners get blocks from the
// next step, late blocks are backed up, and the state never depends on
// who computed what.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/coordinator_mirror.h"
#include "server/step_coordinator.h"
#include "tests/coordinator_harness.h"
#include "tests/same_state.h"

namespace dp {
namespace {

const ModelLayout& Layout() {
  static const ModelLayout* l = new ModelLayout(ModelLayout::Mlp({6, 5, 3}));
  return *l;
}

ElasticOptions Instant() {
  ElasticOptions o;
  o.start_wait = absl::ZeroDuration();
  return o;
}

// A coordinator with `elastic` whose ranks [0, registered) have joined.
std::unique_ptr<StepCoordinator> Started(const JobConfig& job, int registered,
                                         const ElasticOptions& elastic) {
  CoordinatorSetup setup;
  setup.job = job;
  setup.elastic = elastic;
  setup.registered = registered;
  return MakeTestCoordinator(Layout(), setup);
}

// The same without straggler backups: they have their own tests, on a
// clock of their own; timing plays no part here.
std::unique_ptr<StepCoordinator> Make(const JobConfig& job, int registered,
                                      ElasticOptions elastic = Instant()) {
  elastic.backup_blocks = 0;
  return Started(job, registered, elastic);
}

// A clock that moves only when the test moves it. The coordinator reads it
// under its lock, from the test's thread and its straggler thread.
class ManualClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1000000);
};

// Straggler backups (the default factor 3 and minimum wait 20 ms) on
// `clock`, which must outlive the coordinator: the step starts now by it.
std::unique_ptr<StepCoordinator> MakeOnClock(const JobConfig& job,
                                             int registered, ManualClock* clock,
                                             int backup_blocks) {
  ElasticOptions elastic = Instant();
  elastic.backup_blocks = backup_blocks;
  elastic.straggler_factor = 3.0;
  elastic.straggler_min_wait = absl::Milliseconds(20);
  elastic.clock = [clock] { return clock->Now(); };
  return Started(job, registered, elastic);
}

// A wait that did not end at once, and how it ended once it does.
struct Wait {
  bool ready = false;  // it did end at once, with `work`
  absl::Notification woken;
  absl::Status status;
  int64_t step = -1;
  Block work;
};
// Shared with its callback, which the coordinator may run after the test
// let go of it (failing the waits at destruction).
std::shared_ptr<Wait> WaitIdle(StepCoordinator& c, int rank, int step) {
  auto w = std::make_shared<Wait>();
  auto ticket = c.WaitForStep(
      rank, step, [w](const absl::Status& s, int64_t new_step, Block work) {
        w->status = s;
        w->step = new_step;
        w->work = work;
        w->woken.Notify();
      });
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  if (ticket.ok() && ticket->ready) {
    ADD_FAILURE() << "rank " << rank << " was to wait; it was given "
                  << ticket->work.ToString();
    w->ready = true;
    w->work = ticket->work;
  }
  return w;
}

// What the wait was handed, once it ended (the straggler thread may be
// the one that ran its callback).
Block Handed(Wait& w) {
  if (w.ready) return w.work;
  EXPECT_TRUE(w.woken.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(w.status.ok()) << w.status;
  return w.work;
}

// Micro-batch j's gradient at `step`: mixed magnitudes, so that adding in
// another order gives other bits.
std::vector<float> Leaf(int j, int step) {
  std::vector<float> g(Layout().num_params());
  for (size_t i = 0; i < g.size(); ++i) {
    const float scale = j % 2 == 0 ? 1e7f : 1.0f;
    g[i] = scale * std::sin(0.37f * i + j * 1.3f + step * 0.11f) + 0.1f * j;
  }
  return g;
}

// What a worker pushes for `b`: its leaves summed in tree order.
std::string BlockSum(const Block& b, int step) {
  std::vector<std::vector<float>> leaves;
  for (int j = b.first; j < b.end(); ++j) leaves.push_back(Leaf(j, step));
  std::vector<float*> p;
  for (auto& l : leaves) p.push_back(l.data());
  std::vector<float> out(Layout().num_params());
  SumInTreeOrder(p, out.size(), out.data());
  return WireBytes(out);
}

// The step's root written out by hand, in the tree docs/elastic.md draws:
// K = 3 is (g0 + g1) + g2, K = 5 ((g0 + g1) + g2) + (g3 + g4). A reference
// that comes from neither the workers' SumInTreeOrder nor dp-ps's sums.
std::string HandRoot(int k, int step) {
  std::vector<std::vector<float>> g;
  for (int j = 0; j < k; ++j) g.push_back(Leaf(j, step));
  std::vector<float> out(Layout().num_params());
  for (size_t i = 0; i < out.size(); ++i) {
    if (k == 3) {
      out[i] = (g[0][i] + g[1][i]) + g[2][i];
    } else if (k == 5) {
      out[i] = ((g[0][i] + g[1][i]) + g[2][i]) + (g[3][i] + g[4][i]);
    } else {
      ADD_FAILURE() << "no tree written out for K = " << k;
    }
  }
  return WireBytes(out);
}

absl::Status PushBlock(StepCoordinator& c, int rank, int step, Block b) {
  return c.Push(rank, step, 0, BlockSum(b, step), 1.0f, Encoding::kF32, b)
      .status();
}

// Two steps of 4 micro-batches computed as 4 leaves, as 2 blocks, as the
// whole step by one rank, and as a mix pushed out of order and twice: one
// state, bit for bit.
TEST(ElasticCoordinatorTest, TheStateDependsOnTheMicroBatchesNotOnWhoPushed) {
  const JobConfig job = TestJob(4, 4);
  const std::vector<std::vector<std::pair<int, Block>>> ways = {
      {{0, {0, 1}}, {1, {1, 1}}, {2, {2, 1}}, {3, {3, 1}}},
      {{0, {0, 2}}, {1, {2, 2}}},
      {{3, {0, 4}}},
      {{2, {3, 1}}, {0, {0, 2}}, {1, {3, 1}}, {1, {2, 1}}},
  };
  std::vector<TrainingState> results;
  for (const auto& way : ways) {
    auto c = Make(job, 4);
    for (int step = 0; step < 2; ++step) {
      for (const auto& [rank, block] : way) {
        ASSERT_TRUE(PushBlock(*c, rank, step, block).ok());
      }
    }
    results.push_back(c->Snapshot());
  }
  EXPECT_EQ(results[0].step, 2);
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_TRUE(SameState(results[0], results[i])) << "way " << i;
  }
}

// Odd K, where a block summed in another order than the tree's shows (at
// K = 4 every plan's blocks are pairs or leaves): two steps end in the
// state of the roots written out by hand, whether dp-ps adds up the leaves
// or ranks push the blocks of a plan for 2, summed as workers sum them.
TEST(ElasticCoordinatorTest, OddStepsAreSummedInTheDocumentedTree) {
  for (const int k : {3, 5}) {
    const JobConfig job = TestJob(k, k);
    auto by_hand = Make(job, k);
    auto leaves = Make(job, k);
    auto blocks = Make(job, k);
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(by_hand
                      ->Push(0, step, 0, HandRoot(k, step), 1.0f,
                             Encoding::kF32, Root(k))
                      .ok());
      for (int j = k - 1; j >= 0; --j) {  // the last first
        ASSERT_TRUE(PushBlock(*leaves, j, step, {j, 1}).ok());
      }
      for (const Block& b : SplitForWorkers(k, 2)) {
        ASSERT_TRUE(PushBlock(*blocks, 0, step, b).ok()) << b.ToString();
      }
    }
    const TrainingState reference = by_hand->Snapshot();
    ASSERT_EQ(reference.step, 2);
    EXPECT_TRUE(SameState(leaves->Snapshot(), reference))
        << "K " << k << ": dp-ps's sums of the leaves";
    EXPECT_TRUE(SameState(blocks->Snapshot(), reference))
        << "K " << k << ": blocks " << SplitForWorkers(k, 2)[0].ToString()
        << " and " << SplitForWorkers(k, 2)[1].ToString();
  }
}

TEST(ElasticCoordinatorTest, CopiesCountOnceAndABlockMustBeANode) {
  auto c = Make(TestJob(4, 4), 4);
  ASSERT_TRUE(PushBlock(*c, 0, 0, {0, 2}).ok());
  auto again =
      c->Push(1, 0, 0, BlockSum({0, 2}, 0), 1.0f, Encoding::kF32, Block{0, 2});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  auto inside =
      c->Push(1, 0, 0, BlockSum({1, 1}, 0), 1.0f, Encoding::kF32, Block{1, 1});
  ASSERT_TRUE(inside.ok());
  EXPECT_TRUE(inside->duplicate);
  EXPECT_EQ(c->Status().elastic.duplicate_pushes, 2);
  const auto before = c->Observe();
  const absl::Status odd = PushBlock(*c, 2, 0, {1, 2});
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument) << odd;
  EXPECT_NE(odd.message().find("[1,3)"), std::string::npos) << odd;
  // Whatever the step: not ABORTED for a future one.
  const absl::Status future = PushBlock(*c, 2, 7, {1, 2});
  EXPECT_EQ(future.code(), absl::StatusCode::kInvalidArgument) << future;
  EXPECT_EQ(ObservableDifferences(before, c->Observe()), "");
}

TEST(ElasticCoordinatorTest, ThePlanSplitsTheStepAmongTheLiveRanks) {
  auto c = Make(TestJob(4, 4), 3);
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{0, 1}, {1, 1}, {2, 2}, {}}));
  // Rank 3 joins before anything of the step is in: planned again.
  ASSERT_TRUE(RegisterRank(*c, 3).ok());
  EXPECT_EQ(c->Status().plan,
            (std::vector<Block>{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  ASSERT_EQ(c->Pull(2, 0, 0)->block, (Block{2, 1}));
}

TEST(ElasticCoordinatorTest, AJoinerGetsBlocksFromTheNextStepOn) {
  auto c = Make(TestJob(4, 2), 1);
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{0, 2}, {}, {}, {}}));
  ASSERT_TRUE(PushBlock(*c, 0, 0, {0, 1}).ok());
  ASSERT_TRUE(RegisterRank(*c, 1).ok());
  EXPECT_TRUE(c->Pull(1, 0, 0)->block.empty()) << "mid-step: nothing yet";
  ASSERT_TRUE(PushBlock(*c, 0, 0, {1, 1}).ok());
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{0, 1}, {1, 1}, {}, {}}));
}

TEST(ElasticCoordinatorTest, TheFirstStepWaitsForEveryRankUntilTheStartWait) {
  ElasticOptions patient;
  patient.start_wait = absl::Hours(1);
  auto c = Make(TestJob(2, 2), 1, patient);
  EXPECT_TRUE(c->Pull(0, 0, 0)->block.empty()) << "rank 1 is not there yet";
  ASSERT_TRUE(RegisterRank(*c, 1).ok());
  EXPECT_EQ(c->Pull(0, 0, 0)->block, (Block{0, 1}));
  ElasticOptions impatient;
  impatient.start_wait = absl::ZeroDuration();
  auto d = Make(TestJob(2, 2), 1, impatient);
  EXPECT_EQ(d->Pull(0, 0, 0)->block, (Block{0, 2}));
}

// The start wait counts from the first registration, not from dp-ps's
// start: workers that come long after dp-ps (a slow image pull, a long
// import) still start together, and the first to come does not train
// alone.
TEST(ElasticCoordinatorTest, TheStartWaitCountsFromTheFirstRegistration) {
  ManualClock clock;
  ElasticOptions patient;
  patient.backup_blocks = 0;
  patient.start_wait = absl::Seconds(30);
  patient.clock = [&clock] { return clock.Now(); };
  auto c = Started(TestJob(2, 2), 0, patient);
  clock.Advance(absl::Hours(1));  // dp-ps waited an hour for anyone
  ASSERT_TRUE(RegisterRank(*c, 0).ok());
  c->CheckLeases(absl::Hours(1));
  EXPECT_TRUE(c->Pull(0, 0, 0)->block.empty()) << "rank 1 is not there yet";
  clock.Advance(absl::Seconds(30) - absl::Nanoseconds(1));
  c->CheckLeases(absl::Hours(1));
  EXPECT_TRUE(c->Pull(0, 0, 0)->block.empty()) << "still within the wait";
  clock.Advance(absl::Nanoseconds(1));
  c->CheckLeases(absl::Hours(1));  // what dp-ps's lease thread calls
  EXPECT_EQ(c->Pull(0, 0, 0)->block, (Block{0, 2})) << "the wait is over";
}

// A push while the step waits for ranks counts (any node does), and
// planning the step when the last rank registers keeps it.
TEST(ElasticCoordinatorTest, PlanningTheStepKeepsWhatIsIn) {
  ElasticOptions patient;
  patient.start_wait = absl::Hours(1);
  auto c = Make(TestJob(2, 2), 1, patient);
  ASSERT_TRUE(PushBlock(*c, 0, 0, {0, 1}).ok());
  const auto before = c->Observe();
  ASSERT_TRUE(RegisterRank(*c, 1).ok());
  EXPECT_EQ(c->Status().pushed_ranks, std::vector<int>{0});
  const auto after = c->Observe();
  ASSERT_EQ(after.sums.size(), 1u);
  EXPECT_EQ(after.sums[0].first, (Block{0, 1}));
  EXPECT_EQ(after.sums[0].second, before.sums[0].second);
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{0, 1}, {1, 1}}));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  EXPECT_EQ(c->Status().step, 1);
}

TEST(ElasticCoordinatorTest, StepsWaitForMinWorkers) {
  auto c = Make(TestJob(3, 2, /*min_workers=*/2), 1);
  EXPECT_TRUE(c->Pull(0, 0, 0)->block.empty());
  ASSERT_TRUE(RegisterRank(*c, 1).ok());
  EXPECT_EQ(c->Pull(0, 0, 0)->block, (Block{0, 1}));
  EXPECT_EQ(c->Pull(1, 0, 0)->block, (Block{1, 1}));
}

// --min_workers=2, ranks 0 and 1 of 3 there: rank 1 pushed its block and
// waits when rank 0 is lost, which leaves one live. Rank 0's block goes to
// no one (the step waits) until a second rank is live; then to rank 1.
TEST(ElasticCoordinatorTest,
     BelowMinWorkersALostRanksBlockWaitsForEnoughRanks) {
  auto c = Make(TestJob(3, 3, /*min_workers=*/2), 0);
  auto r0 = RegisterRank(*c, 0);
  ASSERT_TRUE(r0.ok() && RegisterRank(*c, 1).ok());
  ASSERT_EQ(c->Status().plan, (std::vector<Block>{{0, 2}, {2, 1}, {}}));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {2, 1}).ok());
  const std::shared_ptr<Wait> wait = WaitIdle(*c, 1, 0);
  c->ConnectionClosed(0, r0->session);
  EXPECT_EQ(c->Status().live_ranks, std::vector<int>{1});
  EXPECT_FALSE(wait->woken.HasBeenNotified())
      << "handed " << wait->work.ToString() << " below --min_workers";
  EXPECT_EQ(c->Status().elastic.blocks_reassigned, 0);
  EXPECT_EQ(c->Status().waits_for, std::vector<int>{0});
  // Rank 2 joins: two live. Rank 0's block goes to the rank that waits;
  // the joiner gets blocks from the next step on.
  ASSERT_TRUE(RegisterRank(*c, 2).ok());
  EXPECT_EQ(Handed(*wait), (Block{0, 2}));
  EXPECT_EQ(c->Status().elastic.blocks_reassigned, 1);
  EXPECT_TRUE(c->Pull(2, 0, 0)->block.empty());
  ASSERT_TRUE(PushBlock(*c, 1, 0, {0, 2}).ok());
  EXPECT_EQ(c->Status().step, 1);
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{}, {0, 2}, {2, 1}}));
}

// A rank that the next plan leaves out (lost; its block of step 0 was
// handed on) has no block in it: the step does not wait for its old one,
// and it gets none back when it returns mid-step, only from the plan after.
TEST(ElasticCoordinatorTest, ARankLeftOutOfThePlanKeepsNoOldBlock) {
  auto c = Make(TestJob(3, 3), 0);
  auto r0 = RegisterRank(*c, 0);
  ASSERT_TRUE(r0.ok());
  ASSERT_TRUE(RegisterRank(*c, 1).ok());
  ASSERT_TRUE(RegisterRank(*c, 2).ok());
  ASSERT_TRUE(PushBlock(*c, 2, 0, {2, 1}).ok());
  const std::shared_ptr<Wait> wait = WaitIdle(*c, 2, 0);
  c->ConnectionClosed(0, r0->session);
  ASSERT_EQ(Handed(*wait), (Block{0, 1}));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  ASSERT_TRUE(PushBlock(*c, 2, 0, {0, 1}).ok());
  ASSERT_EQ(c->Status().step, 1);
  const std::vector<Block> plan = {{}, {0, 2}, {2, 1}};
  EXPECT_EQ(c->Status().plan, plan);
  EXPECT_EQ(c->Observe().work, plan) << "what each rank computes now";
  EXPECT_EQ(c->Status().waits_for, (std::vector<int>{1, 2}));
  ASSERT_TRUE(PushBlock(*c, 2, 1, {2, 1}).ok());
  EXPECT_EQ(c->Status().waits_for, std::vector<int>{1});
  // Rank 0 is back while a block of step 1 is in: nothing for it yet, so
  // it waits for the next step.
  ASSERT_TRUE(RegisterRank(*c, 0).ok());
  EXPECT_TRUE(c->Pull(0, 0, 0)->block.empty())
      << c->Pull(0, 0, 0)->block.ToString();
  const std::shared_ptr<Wait> back = WaitIdle(*c, 0, 1);
  EXPECT_EQ(c->Status().waits_for, std::vector<int>{1});
  ASSERT_TRUE(PushBlock(*c, 1, 1, {0, 2}).ok());
  EXPECT_EQ(c->Status().step, 2);
  EXPECT_EQ(Handed(*back), Block{}) << "woken by the update";
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{0, 1}, {1, 1}, {2, 1}}));
}

// Rank 0 goes silent past its lease while rank 1 waits: its block is
// handed to rank 1's wait, and the step completes without rank 0.
TEST(ElasticCoordinatorTest, ALostRanksBlockGoesToARankThatWaits) {
  auto c = Make(TestJob(2, 2), 2);
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  Block handed;
  absl::Notification woken;
  auto ticket = c->WaitForStep(
      1, 0, [&](const absl::Status& s, int64_t step, Block work) {
        EXPECT_TRUE(s.ok()) << s;
        EXPECT_EQ(step, 0);
        handed = work;
        woken.Notify();
      });
  ASSERT_TRUE(ticket.ok());
  ASSERT_FALSE(ticket->ready);
  std::vector<StepCoordinator::LeaseEvent> events =
      c->CheckLeases(absl::ZeroDuration());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank, 0);
  EXPECT_EQ(events[0].kind, StepCoordinator::LeaseEvent::kMissing);
  ASSERT_TRUE(woken.HasBeenNotified());
  EXPECT_EQ(handed, (Block{0, 1}));
  EXPECT_EQ(c->Status().live_ranks, std::vector<int>{1});
  ASSERT_TRUE(PushBlock(*c, 1, 0, {0, 1}).ok());
  EXPECT_EQ(c->Status().step, 1);
  EXPECT_EQ(c->Status().elastic.blocks_reassigned, 1);
  EXPECT_EQ(c->Status().plan, (std::vector<Block>{{}, {0, 2}}));
  // Rank 0 comes back: its late push is acknowledged, not counted, and it
  // takes part again from the next plan.
  auto late = c->Push(0, 0, 0, BlockSum({0, 1}, 0), 1.0f);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->duplicate);
  EXPECT_EQ(c->Status().live_ranks, (std::vector<int>{0, 1}));
}

// A closed connection (the Attend call of the rank's registration ended)
// makes the rank missing at once, long before its lease would run out.
TEST(ElasticCoordinatorTest, AClosedConnectionHandsTheBlockOnAtOnce) {
  auto owned = Make(TestJob(2, 2), 0);
  StepCoordinator& c = *owned;
  auto r0 = RegisterRank(c, 0);
  auto r1 = RegisterRank(c, 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  ASSERT_NE(r0->session, r1->session);
  ASSERT_TRUE(c.Attend(0, r0->session).ok());
  ASSERT_TRUE(PushBlock(c, 1, 0, {1, 1}).ok());
  Block handed;
  auto ticket =
      c.WaitForStep(1, 0, [&](const absl::Status& st, int64_t, Block work) {
        EXPECT_TRUE(st.ok()) << st;
        handed = work;
      });
  ASSERT_TRUE(ticket.ok());
  ASSERT_FALSE(ticket->ready);
  c.ConnectionClosed(0, r0->session);
  EXPECT_EQ(handed, (Block{0, 1}));
  EXPECT_EQ(c.Status().live_ranks, std::vector<int>{1});
  std::vector<StepCoordinator::LeaseEvent> events =
      c.CheckLeases(absl::Hours(1));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank, 0);
  EXPECT_EQ(events[0].kind, StepCoordinator::LeaseEvent::kMissing);
  EXPECT_TRUE(events[0].closed);
  ASSERT_TRUE(PushBlock(c, 1, 0, {0, 1}).ok());
  EXPECT_EQ(c.Status().step, 1);
  // The process comes back: a new registration, live again.
  auto again = RegisterRank(c, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(c.Status().live_ranks, (std::vector<int>{0, 1}));
  events = c.CheckLeases(absl::Hours(1));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, StepCoordinator::LeaseEvent::kBack);
}

// A call of a killed process that dp-ps handles after its connection
// closed (a push it had sent, read from shared memory after the close) is
// no sign of life: the rank stays missing, and in the failing policy the
// job still hears of the loss. Only a new registration brings it back.
TEST(ElasticCoordinatorTest, ACallHandledAfterTheConnectionClosedRevivesNoOne) {
  for (const bool reassign : {true, false}) {
    SCOPED_TRACE(reassign ? "reassign" : "wait or fail");
    ElasticOptions elastic = Instant();
    elastic.on_worker_loss =
        reassign ? OnWorkerLoss::kReassign : OnWorkerLoss::kWait;
    auto c = Make(TestJob(2, 2), 0, elastic);
    auto r0 = RegisterRank(*c, 0);
    auto r1 = RegisterRank(*c, 1);
    ASSERT_TRUE(r0.ok() && r1.ok());
    c->ConnectionClosed(1, r1->session);
    (void)PushBlock(*c, 1, 0, {1, 1});  // in flight when it died
    std::vector<StepCoordinator::LeaseEvent> events =
        c->CheckLeases(absl::Hours(1));
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].rank, 1);
    EXPECT_EQ(events[0].kind, StepCoordinator::LeaseEvent::kMissing);
    EXPECT_TRUE(events[0].closed);
    // With --on_worker_loss=wait a missing rank stays live: its step waits.
    const std::vector<int> live =
        reassign ? std::vector<int>{0} : std::vector<int>{0, 1};
    EXPECT_EQ(c->Status().live_ranks, live);
    (void)PushBlock(*c, 1, 0, {1, 1});
    EXPECT_EQ(c->Status().live_ranks, live);
    EXPECT_TRUE(c->CheckLeases(absl::Hours(1)).empty()) << "back?";
    ASSERT_TRUE(RegisterRank(*c, 1).ok());
    events = c->CheckLeases(absl::Hours(1));
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, StepCoordinator::LeaseEvent::kBack);
  }
}

// The end of a registration's call once the rank registered again (the
// process came back, or another took the rank) is nobody's departure, and
// that old session can no longer attend.
TEST(ElasticCoordinatorTest, TheEndOfAnOlderRegistrationChangesNothing) {
  auto owned = Started(TestJob(2, 2), 0, Instant());
  StepCoordinator& c = *owned;
  auto old = RegisterRank(c, 0);
  ASSERT_TRUE(old.ok());
  auto now = RegisterRank(c, 0);
  ASSERT_TRUE(now.ok());
  ASSERT_TRUE(RegisterRank(c, 1).ok());
  EXPECT_EQ(c.Attend(0, old->session).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.Attend(1, now->session).code(),
            absl::StatusCode::kFailedPrecondition)
      << "another rank's session";
  EXPECT_EQ(c.Attend(0, now->session), absl::OkStatus());
  const StepCoordinator::ObservableState before = c.Observe();
  c.ConnectionClosed(0, old->session);
  c.ConnectionClosed(1, now->session);
  c.ConnectionClosed(-1, now->session);
  c.ConnectionClosed(2, now->session);
  EXPECT_EQ(ObservableDifferences(before, c.Observe()), "");
  EXPECT_EQ(c.Status().live_ranks, (std::vector<int>{0, 1}));
  EXPECT_TRUE(c.CheckLeases(absl::Hours(1)).empty());
}

// A coordinator of 2 ranks, each registered by a process of its own
// ("host/1" rank 0, "host/2" rank 1), rank 0 attending; lease and policy
// as given.
struct TwoProcesses {
  explicit TwoProcesses(absl::Duration lease, bool reassign = true,
                        const JobConfig& job = TestJob(2, 2))
      : owned([&] {
          ElasticOptions elastic = Instant();
          elastic.lease = lease;
          elastic.on_worker_loss =
              reassign ? OnWorkerLoss::kReassign : OnWorkerLoss::kWait;
          return Make(job, 0, elastic);
        }()),
        c(*owned) {
    auto r0 = Register(0, "host/1");
    auto r1 = Register(1, "host/2");
    EXPECT_TRUE(r0.ok() && r1.ok());
    if (r0.ok()) session0 = r0->session;
    EXPECT_TRUE(c.Attend(0, session0).ok());
  }
  absl::StatusOr<StepCoordinator::Registration> Register(
      int rank, absl::string_view worker_id) {
    return RegisterRank(c, rank, kTestData, worker_id);
  }
  std::unique_ptr<StepCoordinator> owned;
  StepCoordinator& c;
  uint64_t session0 = 0;
};

// A second process of a live rank (a pod's replacement while the pod still
// runs) is refused, naming the holder, and changes nothing: it does not
// take the rank, with or without asking for it by number; the holder
// itself registers again (a re-join) as before.
TEST(ElasticCoordinatorTest, AHeldRankRefusesAnotherProcessAndNothingChanges) {
  TwoProcesses job(absl::Hours(1));
  const StepCoordinator::ObservableState before = job.c.Observe();
  auto second = job.Register(0, "host/3");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted)
      << second.status();
  EXPECT_NE(second.status().message().find(
                "rank 0 is held by a live process (host/1"),
            std::string::npos)
      << second.status();
  auto any = job.c.Register(StepCoordinator::kAnyRank, Layout().Fingerprint(),
                            kTestData, "host/3", /*preferred=*/0);
  EXPECT_EQ(any.status().code(), absl::StatusCode::kResourceExhausted)
      << any.status();
  auto anonymous = job.Register(1, "");
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kResourceExhausted)
      << anonymous.status();
  EXPECT_EQ(ObservableDifferences(before, job.c.Observe()), "");
  EXPECT_TRUE(job.c.Attend(0, job.session0).ok()) << "still the holder's";
  // The holder registering again is no newcomer.
  auto again = job.Register(0, "host/1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->session, job.session0);
  EXPECT_EQ(job.c.Status().live_ranks, (std::vector<int>{0, 1}));
}

// Once the holder's connection closes (kill -9 of its process) the
// newcomer gets the rank at once, with the step waiting for the rank
// (--on_worker_loss=wait) as with its block handed on; the old process is
// then the one refused.
TEST(ElasticCoordinatorTest,
     AHeldRankGoesToTheNewcomerOnceItsConnectionCloses) {
  for (const bool reassign : {true, false}) {
    SCOPED_TRACE(reassign ? "reassign" : "wait");
    TwoProcesses job(absl::Hours(1), reassign);
    ASSERT_EQ(job.Register(0, "host/3").status().code(),
              absl::StatusCode::kResourceExhausted);
    job.c.ConnectionClosed(0, job.session0);
    auto taken = job.Register(0, "host/3");
    ASSERT_TRUE(taken.ok()) << taken.status();
    EXPECT_EQ(taken->rank, 0);
    EXPECT_EQ(job.c.Status().live_ranks, (std::vector<int>{0, 1}));
    EXPECT_EQ(job.c.Attend(0, job.session0).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(job.c.Attend(0, taken->session).ok());
    const StepCoordinator::ObservableState before = job.c.Observe();
    auto old = job.Register(0, "host/1");
    EXPECT_EQ(old.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(old.status().message().find("(host/3"), std::string::npos)
        << old.status();
    EXPECT_EQ(ObservableDifferences(before, job.c.Observe()), "");
    // A rank-less worker gets such a rank too.
    TwoProcesses rankless(absl::Hours(1), reassign);
    rankless.c.ConnectionClosed(0, rankless.session0);
    auto any = rankless.c.Register(StepCoordinator::kAnyRank,
                                   Layout().Fingerprint(), kTestData, "host/4");
    ASSERT_TRUE(any.ok()) << any.status();
    EXPECT_EQ(any->rank, 0);
  }
}

// A holder that waits in a call is live however long it waits; once it
// neither waits nor calls for its lease (here 0: at once), the newcomer
// gets the rank without any connection closing.
TEST(ElasticCoordinatorTest, AHeldRankGoesToTheNewcomerOnceItsLeaseRunsOut) {
  TwoProcesses job(absl::ZeroDuration());
  ASSERT_TRUE(PushBlock(job.c, 0, 0, {0, 1}).ok());
  auto ticket =
      job.c.WaitForStep(0, 0, [](const absl::Status&, int64_t, Block) {});
  ASSERT_TRUE(ticket.ok());
  ASSERT_FALSE(ticket->ready);
  auto waiting = job.Register(0, "host/3");
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(waiting.status().message().find("waiting in a call"),
            std::string::npos)
      << waiting.status();
  ASSERT_TRUE(job.c.CancelWait(ticket->id));
  auto taken = job.Register(0, "host/3");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->rank, 0);
}

// Once every step is applied nothing is left to take: one standing by
// joins at the end (and exits 0), the holder live or not.
TEST(ElasticCoordinatorTest, AfterTheLastStepAHeldRankRefusesNoOne) {
  JobConfig one_step = TestJob(2, 2);
  one_step.schedule.max_steps = 1;
  TwoProcesses job(absl::Hours(1), true, one_step);
  ASSERT_EQ(job.Register(0, "host/3").status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(PushBlock(job.c, 0, 0, {0, 1}).ok());
  ASSERT_TRUE(PushBlock(job.c, 1, 0, {1, 1}).ok());
  ASSERT_TRUE(job.c.done());
  auto at_the_end = job.Register(0, "host/3");
  ASSERT_TRUE(at_the_end.ok()) << at_the_end.status();
  EXPECT_EQ(at_the_end->step, 1);
}

// A lost rank's block handed to a rank that is lost in turn goes on to the
// next rank that waits.
TEST(ElasticCoordinatorTest, ABlockHandedToARankLostInTurnIsHandedOnAgain) {
  auto c = Make(TestJob(3, 3), 3);
  std::vector<Block> handed(3);
  auto wait = [&](int rank) {
    auto t = c->WaitForStep(
        rank, 0, [&handed, rank](const absl::Status& s, int64_t, Block work) {
          EXPECT_TRUE(s.ok()) << s;
          handed[rank] = work;
        });
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_FALSE(t->ready);
  };
  ASSERT_TRUE(PushBlock(*c, 2, 0, {2, 1}).ok());
  wait(2);
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  wait(1);
  c->CheckLeases(absl::ZeroDuration());  // rank 0 is lost
  EXPECT_EQ(handed[2], (Block{0, 1})) << "to the oldest wait";
  EXPECT_TRUE(handed[1].empty());
  c->CheckLeases(absl::ZeroDuration());  // rank 2, computing it, too
  EXPECT_EQ(handed[1], (Block{0, 1}));
  EXPECT_EQ(c->Status().elastic.blocks_reassigned, 2);
  ASSERT_TRUE(PushBlock(*c, 1, 0, {0, 1}).ok());
  EXPECT_EQ(c->Status().step, 1);
}

// With reassign off (--on_worker_loss=wait) the step waits for the rank.
TEST(ElasticCoordinatorTest, WithoutReassignTheStepWaitsForALostRank) {
  ElasticOptions wait = Instant();
  wait.on_worker_loss = OnWorkerLoss::kWait;
  auto c = Make(TestJob(2, 2), 2, wait);
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  auto ticket =
      c->WaitForStep(1, 0, [](const absl::Status&, int64_t, Block) {});
  ASSERT_TRUE(ticket.ok());
  EXPECT_EQ(c->CheckLeases(absl::ZeroDuration()).size(), 1u);
  EXPECT_EQ(c->Status().elastic.blocks_reassigned, 0);
  EXPECT_EQ(c->Status().live_ranks, (std::vector<int>{0, 1}));
  EXPECT_TRUE(c->CancelWait(ticket->id));
}

TEST(ElasticCoordinatorTest, AnyRankPicksAFreeRankAndKeepsAWorkersOwn) {
  CoordinatorSetup nobody;
  nobody.job = TestJob(2, 2);
  nobody.registered = 0;
  auto owned = MakeTestCoordinator(Layout(), nobody);
  StepCoordinator& c = *owned;
  auto a = RegisterRank(c, StepCoordinator::kAnyRank, kTestData, "host/1");
  auto b = RegisterRank(c, StepCoordinator::kAnyRank, kTestData, "host/2");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rank, 0);
  EXPECT_EQ(b->rank, 1);
  auto again = RegisterRank(c, StepCoordinator::kAnyRank, kTestData, "host/2");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank, 1);
  auto full = RegisterRank(c, StepCoordinator::kAnyRank, kTestData, "host/3");
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
}

// Rank 0 does not push; rank 1 waits: once the step has run straggler_
// factor times as long as rank 1's push took (and the minimum wait), rank
// 0's block is handed to rank 1 as well. Rank 0 then sits out the next
// plan, and its late copy is a duplicate.
TEST(ElasticCoordinatorTest, ALateBlockIsBackedUpByAnIdleRank) {
  ElasticOptions fast;
  fast.straggler_factor = 1.5;
  fast.straggler_min_wait = absl::Milliseconds(1);
  auto owned = Started(TestJob(2, 2), 2, fast);
  StepCoordinator& c = *owned;
  ASSERT_TRUE(PushBlock(c, 1, 0, {1, 1}).ok());
  Block handed;
  absl::Notification woken;
  auto ticket =
      c.WaitForStep(1, 0, [&](const absl::Status& st, int64_t, Block work) {
        EXPECT_TRUE(st.ok()) << st;
        handed = work;
        woken.Notify();
      });
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(woken.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(handed, (Block{0, 1}));
  EXPECT_EQ(c.Status().elastic.backups_handed, 1);
  ASSERT_TRUE(PushBlock(c, 1, 0, {0, 1}).ok());
  EXPECT_EQ(c.Status().step, 1);
  EXPECT_EQ(c.Status().last_completed_by, 1);
  EXPECT_EQ(c.Status().plan, (std::vector<Block>{{}, {0, 2}}))
      << "the straggler sits out";
  auto late = c.Push(0, 0, 0, BlockSum({0, 1}, 0), 1.0f);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->duplicate);
}

// The deadline of a late block is counted from the step's start: the
// first push came 100 ms into the step, so the step's block of rank 0 is
// late at 3 x 100 ms (more than the 20 ms minimum), not a moment before,
// and not 300 ms after that push.
TEST(ElasticCoordinatorTest, ABlockIsLateAtTheFactorTimesTheFirstPush) {
  ManualClock clock;
  const absl::Time start = clock.Now();
  auto c = MakeOnClock(TestJob(2, 2), 2, &clock, /*backup_blocks=*/1);
  clock.Advance(absl::Milliseconds(100));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  const std::shared_ptr<Wait> wait = WaitIdle(*c, 1, 0);
  const absl::Time due = start + absl::Milliseconds(300);
  EXPECT_EQ(c->BackUpLateBlocks(), due);
  clock.Advance(absl::Milliseconds(200) - absl::Nanoseconds(1));
  EXPECT_EQ(c->BackUpLateBlocks(), due);
  EXPECT_EQ(c->Status().elastic.backups_handed, 0) << "before its time";
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(c->BackUpLateBlocks(), absl::InfiniteFuture())
      << "the step's one backup is out";
  EXPECT_EQ(c->Status().elastic.backups_handed, 1);
  EXPECT_EQ(Handed(*wait), (Block{0, 1}));
}

// A quick first push (5 ms; 3 x 5 ms = 15 ms) does not make a block late
// before --straggler_min_wait (20 ms) of the step has passed.
TEST(ElasticCoordinatorTest, ABlockIsNotLateBeforeTheMinimumWait) {
  ManualClock clock;
  const absl::Time start = clock.Now();
  auto c = MakeOnClock(TestJob(2, 2), 2, &clock, /*backup_blocks=*/1);
  clock.Advance(absl::Milliseconds(5));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  const std::shared_ptr<Wait> wait = WaitIdle(*c, 1, 0);
  const absl::Time due = start + absl::Milliseconds(20);
  EXPECT_EQ(c->BackUpLateBlocks(), due);
  clock.Advance(absl::Milliseconds(15) - absl::Nanoseconds(1));
  c->BackUpLateBlocks();
  EXPECT_EQ(c->Status().elastic.backups_handed, 0);
  clock.Advance(absl::Nanoseconds(1));
  c->BackUpLateBlocks();
  EXPECT_EQ(c->Status().elastic.backups_handed, 1);
  EXPECT_EQ(Handed(*wait), (Block{0, 1}));
}

// --backup_blocks=2 of 4 ranks, three of them late: one idle rank is
// handed two late blocks in turn, not the third; the count starts again
// with the next step, whose deadline is counted from that step's start.
TEST(ElasticCoordinatorTest, AtMostBackupBlocksAStepAreHandedOut) {
  ManualClock clock;
  auto c = MakeOnClock(TestJob(4, 4), 4, &clock, /*backup_blocks=*/2);
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(PushBlock(*c, 3, 0, {3, 1}).ok());
  clock.Advance(absl::Milliseconds(30));  // late at 3 x 10 ms
  std::shared_ptr<Wait> wait = WaitIdle(*c, 3, 0);
  c->BackUpLateBlocks();
  ASSERT_EQ(Handed(*wait), (Block{0, 1}));
  ASSERT_TRUE(PushBlock(*c, 3, 0, {0, 1}).ok());
  wait = WaitIdle(*c, 3, 0);
  c->BackUpLateBlocks();
  ASSERT_EQ(Handed(*wait), (Block{1, 1}));
  ASSERT_TRUE(PushBlock(*c, 3, 0, {1, 1}).ok());
  wait = WaitIdle(*c, 3, 0);
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(c->BackUpLateBlocks(), absl::InfiniteFuture());
  EXPECT_EQ(c->Status().elastic.backups_handed, 2);
  EXPECT_FALSE(wait->woken.HasBeenNotified())
      << "a third backup: " << wait->work.ToString();
  // Rank 2's push completes step 0; ranks 0 and 1, whose blocks were
  // backed up, sit out the plan of step 1.
  ASSERT_TRUE(PushBlock(*c, 2, 0, {2, 1}).ok());
  ASSERT_EQ(Handed(*wait), Block{}) << "step 0 applied";
  ASSERT_EQ(c->Status().plan, (std::vector<Block>{{}, {}, {0, 2}, {2, 2}}));
  const absl::Time step1 = clock.Now();
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(PushBlock(*c, 3, 1, {2, 2}).ok());
  wait = WaitIdle(*c, 3, 1);
  EXPECT_EQ(c->BackUpLateBlocks(), step1 + absl::Milliseconds(30));
  clock.Advance(absl::Milliseconds(20));
  c->BackUpLateBlocks();
  EXPECT_EQ(Handed(*wait), (Block{0, 2}));
  EXPECT_EQ(c->Status().elastic.backups_handed, 3);
}

// A step whose blocks are all with one rank (the other sits out as a
// straggler) may get no push to count from: if that rank stops, its block
// is late at the factor times the step before's length, and the idle rank
// backs it up, instead of the step waiting for the lease.
TEST(ElasticCoordinatorTest,
     AStepWithNoPushIsLateAtTheFactorTimesTheStepBefore) {
  ManualClock clock;
  auto c = MakeOnClock(TestJob(2, 2), 2, &clock, /*backup_blocks=*/1);
  // Step 0 lasts 30 ms: rank 1 pushes at 10 ms and backs up rank 0's
  // block, late at 3 x 10 ms.
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  std::shared_ptr<Wait> wait = WaitIdle(*c, 1, 0);
  clock.Advance(absl::Milliseconds(20));
  c->BackUpLateBlocks();
  ASSERT_EQ(Handed(*wait), (Block{0, 1}));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {0, 1}).ok());
  ASSERT_EQ(c->Status().plan, (std::vector<Block>{{}, {0, 2}}));
  // Step 1: rank 1 computes everything and pushes nothing; rank 0 waits.
  const absl::Time step1 = clock.Now();
  wait = WaitIdle(*c, 0, 1);
  EXPECT_EQ(c->BackUpLateBlocks(), step1 + absl::Milliseconds(90));
  clock.Advance(absl::Milliseconds(90) - absl::Nanoseconds(1));
  c->BackUpLateBlocks();
  EXPECT_EQ(c->Status().elastic.backups_handed, 1) << "before its time";
  clock.Advance(absl::Nanoseconds(1));
  c->BackUpLateBlocks();
  EXPECT_EQ(Handed(*wait), (Block{0, 2}));
  EXPECT_EQ(c->Status().elastic.backups_handed, 2);
}

// --backup_blocks=0: no block is ever handed out twice, however late.
TEST(ElasticCoordinatorTest, NoBackupsWithZeroBackupBlocks) {
  ManualClock clock;
  auto c = MakeOnClock(TestJob(2, 2), 2, &clock, /*backup_blocks=*/0);
  clock.Advance(absl::Milliseconds(10));
  ASSERT_TRUE(PushBlock(*c, 1, 0, {1, 1}).ok());
  const std::shared_ptr<Wait> wait = WaitIdle(*c, 1, 0);
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(c->BackUpLateBlocks(), absl::InfiniteFuture());
  EXPECT_EQ(c->Status().elastic.backups_handed, 0);
  EXPECT_FALSE(wait->woken.HasBeenNotified()) << wait->work.ToString();
  EXPECT_EQ(c->Status().waits_for, std::vector<int>{0});
}

}  // namespace
}  // namespace dp
