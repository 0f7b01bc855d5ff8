// StepStats: the coordinator's counts of its steps, on their own.
#include "server/step_stats.h"

#include "gtest/gtest.h"

namespace dp {
namespace {

TEST(StepStatsTest, WaitsCountOnlyForRanksThatPushedFromTheirArrival) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  StepStats stats(3, t0);
  EXPECT_FALSE(stats.any_applied());
  stats.Arrived(0, t0 + absl::Milliseconds(10));
  stats.Arrived(2, t0 + absl::Milliseconds(30));
  stats.CompletedBy(2);
  stats.Applied(/*step=*/5, t0 + absl::Milliseconds(30),
                t0 + absl::Milliseconds(40), {true, false, true},
                absl::Milliseconds(7));
  EXPECT_TRUE(stats.any_applied());
  EXPECT_EQ(stats.times().wait_time[0], absl::Milliseconds(30));
  EXPECT_EQ(stats.times().wait_time[1], absl::ZeroDuration());
  EXPECT_EQ(stats.times().wait_time[2], absl::Milliseconds(10));
  EXPECT_EQ(stats.times().apply_time, absl::Milliseconds(10));
  // The second update adds up; the first applied step stays the first.
  stats.Arrived(1, t0 + absl::Milliseconds(50));
  stats.CompletedBy(1);
  stats.Applied(6, t0 + absl::Milliseconds(50), t0 + absl::Milliseconds(53),
                {false, true, false}, absl::Milliseconds(9));
  EXPECT_EQ(stats.times().applies, 2);
  EXPECT_EQ(stats.times().apply_time, absl::Milliseconds(13));
  EXPECT_EQ(stats.times().wait_time[1], absl::Milliseconds(3));
  EXPECT_EQ(stats.times().first_applied_step, 5);
  EXPECT_EQ(stats.times().first_apply, t0 + absl::Milliseconds(40));
  EXPECT_EQ(stats.times().last_apply, t0 + absl::Milliseconds(53));
  EXPECT_EQ(stats.times().first_apply_cpu, absl::Milliseconds(7));
  EXPECT_EQ(stats.times().last_apply_cpu, absl::Milliseconds(9));
  EXPECT_EQ(stats.last_completed_by(), 1);
  EXPECT_EQ(stats.completed_by(), (std::vector<int64_t>{0, 1, 1}));
}

TEST(StepStatsTest, ReadAndUseTimesAndElasticCountsAddUp) {
  StepStats stats(2, absl::UnixEpoch());
  stats.AddRead(absl::Microseconds(7));
  stats.AddRead(absl::Microseconds(5));
  stats.AddUse(absl::Microseconds(3));
  ++stats.counts().duplicate_pushes;
  ++stats.counts().backups_handed;
  ++stats.counts().backups_handed;
  EXPECT_EQ(stats.times().read_time, absl::Microseconds(12));
  EXPECT_EQ(stats.times().use_time, absl::Microseconds(3));
  const StepStats& read_only = stats;
  EXPECT_EQ(read_only.counts().duplicate_pushes, 1);
  EXPECT_EQ(read_only.counts().backups_handed, 2);
  EXPECT_EQ(read_only.counts().blocks_reassigned, 0);
  EXPECT_EQ(stats.last_completed_by(), -1);
}

}  // namespace
}  // namespace dp
