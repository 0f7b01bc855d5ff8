// BlockPlanner alone, on a roster and sums of its own: plans among the
// ranks taking part, stragglers left out, a lost rank's blocks handed on
// (never below --min_workers), and late blocks backed up when due; then
// StragglerBackups handing a late block to an idle wait.
#include "server/block_planner.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/straggler_backups.h"

namespace dp {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);

// A roster of `world` ranks, all registered, and an empty step of K sums.
struct Fixture {
  Fixture(int world, int k, int min_workers = 1)
      : roster(world, kStart),
        sums(k, 2),
        planner(k, min_workers, /*lead=*/true, &roster, &sums) {
    for (int r = 0; r < world; ++r) roster.Register(r, "", kStart);
    planner.Configure(ElasticOptions{}, kStart);
  }
  // Pushes `block` (zeros) as `rank` at `at`.
  void Push(int rank, const Block& block, absl::Time at) {
    const std::string zeros(2 * sizeof(float), '\0');
    SumTree::Folding folding;
    sums.Read(block, Encoding::kF32, zeros, 1e30f, nullptr, &folding);
    planner.Pushed(rank, block, at);
    sums.Accept(block, folding, 0.0f);
  }
  RankRoster roster;
  SumTree sums;
  BlockPlanner planner;
};

TEST(BlockPlannerTest, TheStepsBlocksGoToTheRanksTakingPart) {
  Fixture f(3, 4);
  f.planner.Plan(f.planner.TakingPart(/*hold=*/false));
  // Largest node first, ties leftmost: the last rank gets the half.
  EXPECT_EQ(f.planner.plan(), (std::vector<Block>{{0, 1}, {1, 1}, {2, 2}}));
  EXPECT_EQ(f.planner.work(), f.planner.plan());
  EXPECT_TRUE(f.planner.TakingPart(/*hold=*/true).empty());
}

TEST(BlockPlannerTest, AStragglerIsLeftOutOfTheNextPlanUntilItWaitsInTime) {
  Fixture f(2, 2);
  f.planner.Plan(f.planner.TakingPart(false));
  // Rank 1 pushed nothing and did not wait: rank 0's copy completed it.
  f.Push(0, {0, 2}, kStart);
  f.planner.Applied({false, false});
  EXPECT_EQ(f.planner.last_plan_blocks(), 2);
  f.planner.StartStep(kStart, f.planner.TakingPart(false));
  EXPECT_EQ(f.planner.plan(), (std::vector<Block>{{0, 2}, {}}));
  f.sums.Clear();
  f.Push(0, {0, 2}, kStart);
  f.planner.Applied({false, true});
  f.planner.StartStep(kStart, f.planner.TakingPart(false));
  EXPECT_EQ(f.planner.plan(), (std::vector<Block>{{0, 1}, {1, 1}}));
}

// --min_workers counts the live ranks, stragglers among them: a job whose
// minimum is its world size went on planning nothing once one rank was a
// straggler, and so never applied the step that would have cleared it.
TEST(BlockPlannerTest, AStragglerCountsTowardsMinWorkers) {
  Fixture f(2, 2, /*min_workers=*/2);
  f.planner.Plan(f.planner.TakingPart(false));
  f.Push(0, {0, 2}, kStart);  // rank 1's block backed up by rank 0
  f.planner.Applied({false, false});
  EXPECT_EQ(f.planner.TakingPart(false), std::vector<int>{0});
  f.planner.StartStep(kStart, f.planner.TakingPart(false));
  EXPECT_EQ(f.planner.plan(), (std::vector<Block>{{0, 2}, {}}));
}

TEST(BlockPlannerTest, ALostRanksBlockGoesOnOnlyAtOrAboveMinWorkers) {
  for (const int min_workers : {2, 3}) {
    SCOPED_TRACE(min_workers);
    Fixture f(3, 3, min_workers);
    f.planner.Plan(f.planner.TakingPart(false));
    f.roster.MarkLost(0);
    int64_t reassigned = 0;
    f.Push(1, {1, 1}, kStart);
    const Block got = f.planner.AssignWork(1, &reassigned);
    if (min_workers == 2) {
      EXPECT_EQ(got, (Block{0, 1}));
      EXPECT_EQ(reassigned, 1);
    } else {
      EXPECT_TRUE(got.empty()) << got.ToString();
      EXPECT_EQ(reassigned, 0);
    }
  }
}

TEST(BlockPlannerTest, ABlockIsLateAfterFactorTimesTheFirstPushAndTheMinimum) {
  Fixture f(2, 2);
  ElasticOptions elastic;
  elastic.backup_blocks = 1;
  elastic.straggler_factor = 3.0;
  elastic.straggler_min_wait = absl::Milliseconds(20);
  f.planner.Configure(elastic, kStart);
  f.planner.StartStep(kStart, f.planner.TakingPart(false));
  EXPECT_EQ(f.planner.LateDue(), absl::InfiniteFuture()) << "no push yet";
  f.Push(0, {0, 1}, kStart + absl::Milliseconds(100));
  EXPECT_EQ(f.planner.LateDue(), kStart + absl::Milliseconds(300));
  const Block late = f.planner.LateBlock({true, false});
  EXPECT_EQ(late, (Block{1, 1}));
  f.planner.BackUp(0, late);
  EXPECT_EQ(f.planner.work()[0], late);
  EXPECT_EQ(f.planner.LateDue(), absl::InfiniteFuture()) << "used up";
  // A fast first push: the minimum wait.
  f.sums.Clear();
  f.planner.StartStep(kStart, f.planner.TakingPart(false));
  f.Push(0, {0, 1}, kStart + absl::Milliseconds(1));
  EXPECT_EQ(f.planner.LateDue(), kStart + absl::Milliseconds(20));
}

}  // namespace
// StragglerBackups on a planner: a late block goes to the oldest idle wait
// of a live rank at the step, once it is due.
TEST(StragglerBackupsTest, ALateBlockGoesToTheOldestIdleLiveWaitWhenDue) {
  Fixture f(3, 3);
  ElasticOptions elastic;
  elastic.backup_blocks = 1;
  elastic.straggler_factor = 2.0;
  elastic.straggler_min_wait = absl::Milliseconds(1);
  f.planner.Configure(elastic, kStart);
  f.planner.StartStep(kStart, f.planner.TakingPart(false));
  WaitQueue waits(3);
  StepStats stats(3, kStart);
  StragglerBackups backups(&f.planner, &waits, &f.roster, &stats);
  f.Push(0, {0, 1}, kStart + absl::Milliseconds(10));
  f.Push(1, {1, 1}, kStart + absl::Milliseconds(20));
  EXPECT_EQ(backups.NextDue(7), absl::InfiniteFuture()) << "nobody idle";
  std::vector<WaitQueue::Wake> none;
  std::vector<int> woken;
  auto record = [&](int rank) {
    return [&woken, rank](const absl::Status&, int64_t, Block) {
      woken.push_back(rank);
    };
  };
  waits.Add(1, 6, record(1), 4, &none);  // an old step's wait: not idle
  f.roster.MarkLost(0);
  waits.Add(0, 7, record(0), 4, &none);  // lost: not idle
  EXPECT_EQ(backups.NextDue(7), absl::InfiniteFuture());
  waits.Add(1, 7, record(1), 4, &none);
  EXPECT_EQ(backups.NextDue(7), kStart + absl::Milliseconds(20));
  std::vector<WaitQueue::Wake> wakes = backups.BackUpOne(7);
  ASSERT_EQ(wakes.size(), 1u);
  EXPECT_EQ(wakes[0].work, (Block{2, 1})) << "rank 2's block is late";
  EXPECT_EQ(wakes[0].step, 7);
  EXPECT_EQ(f.planner.work()[1], (Block{2, 1}));
  EXPECT_EQ(stats.counts().backups_handed, 1);
  WaitQueue::Run(wakes);
  EXPECT_EQ(woken, (std::vector<int>{1}));
  EXPECT_EQ(backups.NextDue(7), absl::InfiniteFuture()) << "used up";
  EXPECT_TRUE(backups.BackUpOne(7).empty());
}

}  // namespace dp
