// JobData alone: the job takes the first data set it is given, refuses
// another, and its length follows the data's size.
#include "server/job_data.h"

#include "gtest/gtest.h"

namespace dp {
namespace {

Schedule SmallSchedule() {
  Schedule s;
  s.world_size = 2;
  s.batch_size = 4;
  s.epochs = 1;
  return s;
}

TEST(JobDataTest, TheFirstDataIsAdoptedAndAnotherRefused) {
  JobData data;
  Schedule schedule = SmallSchedule();
  EXPECT_FALSE(data.known());
  EXPECT_FALSE(data.Get().has_value());
  EXPECT_EQ(data.TotalSteps(schedule), 0);
  EXPECT_FALSE(data.Over(0, schedule)) << "no data: not over, not started";
  const DataFingerprint mine{80, 0x1234};
  EXPECT_TRUE(data.CheckSame(0, mine).ok()) << "anything goes before";
  ASSERT_TRUE(data.Adopt(mine, &schedule).ok());
  EXPECT_EQ(schedule.num_samples, 80);
  EXPECT_EQ(data.TotalSteps(schedule), schedule.total_steps());
  EXPECT_GT(data.TotalSteps(schedule), 0);
  EXPECT_TRUE(data.Over(data.TotalSteps(schedule), schedule));
  EXPECT_FALSE(data.Over(data.TotalSteps(schedule) - 1, schedule));
  EXPECT_TRUE(data.CheckSame(1, mine).ok());
  const absl::Status other = data.CheckSame(1, DataFingerprint{80, 0x9999});
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("rank 1"), absl::string_view::npos) << other;
  EXPECT_NE(other.message().find("--data_dir"), absl::string_view::npos);
}

TEST(JobDataTest, DataTheScheduleCannotRunOnChangesNothing) {
  JobData data;
  Schedule schedule = SmallSchedule();
  // Fewer samples than one global batch.
  EXPECT_FALSE(data.Adopt(DataFingerprint{3, 1}, &schedule).ok());
  EXPECT_FALSE(data.known());
  EXPECT_EQ(schedule.num_samples, SmallSchedule().num_samples);
}

}  // namespace
}  // namespace dp
