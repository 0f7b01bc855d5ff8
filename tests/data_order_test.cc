// Tests for common/data_order.h: epoch permutations, the rank/step slicing
// of the global batch, the step counts, and schedule validation.
#include "common/data_order.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

std::vector<int32_t> Iota(int64_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<int32_t> ToVector(absl::Span<const int32_t> s) {
  return std::vector<int32_t>(s.begin(), s.end());
}

Schedule MakeSchedule(int64_t n, int world, int batch, int epochs,
                      int64_t max_steps = 0) {
  Schedule s;
  s.num_samples = n;
  s.world_size = world;
  s.batch_size = batch;
  s.epochs = epochs;
  s.max_steps = max_steps;
  s.seed = 1234;
  s.shuffle = true;
  return s;
}

TEST(EpochOrderTest, IsAPermutation) {
  for (int64_t n : {1, 2, 10, 1000, 60000}) {
    std::vector<int32_t> order = EpochOrder(9, 3, n, /*shuffle=*/true);
    ASSERT_EQ(static_cast<int64_t>(order.size()), n);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, Iota(n)) << "n=" << n;
  }
}

TEST(EpochOrderTest, IsDeterministicPerSeedAndEpoch) {
  EXPECT_EQ(EpochOrder(9, 3, 1000, true), EpochOrder(9, 3, 1000, true));
}

TEST(EpochOrderTest, DiffersBetweenEpochsAndSeeds) {
  const std::vector<int32_t> base = EpochOrder(9, 0, 1000, true);
  EXPECT_NE(base, EpochOrder(9, 1, 1000, true));
  EXPECT_NE(base, EpochOrder(10, 0, 1000, true));
  EXPECT_NE(EpochOrder(9, 1, 1000, true), EpochOrder(9, 2, 1000, true));
}

TEST(EpochOrderTest, ActuallyShuffles) {
  EXPECT_NE(EpochOrder(9, 0, 1000, true), Iota(1000));
}

TEST(EpochOrderTest, IsTheIdentityWhenShuffleIsOff) {
  for (uint64_t seed : {0, 9}) {
    for (int64_t epoch : {0, 5}) {
      EXPECT_EQ(EpochOrder(seed, epoch, 257, /*shuffle=*/false), Iota(257));
    }
  }
}

TEST(ScheduleTest, StepsPerEpochDropsTheLastIncompleteGlobalBatch) {
  EXPECT_EQ(MakeSchedule(103, 4, 5, 1).steps_per_epoch(), 5);  // 3 dropped
  EXPECT_EQ(MakeSchedule(100, 4, 5, 1).steps_per_epoch(), 5);
  EXPECT_EQ(MakeSchedule(99, 4, 5, 1).steps_per_epoch(), 4);
  EXPECT_EQ(MakeSchedule(60000, 1, 64, 1).steps_per_epoch(), 937);
}

TEST(ScheduleTest, TotalStepsIsEpochsTimesStepsCappedByMaxSteps) {
  EXPECT_EQ(MakeSchedule(103, 4, 5, 3).total_steps(), 15);
  EXPECT_EQ(MakeSchedule(103, 4, 5, 3, /*max_steps=*/0).total_steps(), 15);
  EXPECT_EQ(MakeSchedule(103, 4, 5, 3, /*max_steps=*/7).total_steps(), 7);
  EXPECT_EQ(MakeSchedule(103, 4, 5, 3, /*max_steps=*/15).total_steps(), 15);
  EXPECT_EQ(MakeSchedule(103, 4, 5, 3, /*max_steps=*/100).total_steps(), 15);
}

TEST(ScheduleTest, EpochBoundariesFallEveryStepsPerEpochAndAtTheLastStep) {
  const Schedule s = MakeSchedule(103, 4, 5, 3);  // 5 steps per epoch
  for (int64_t step = 0; step < s.total_steps(); ++step) {
    EXPECT_EQ(s.epoch_of(step), step / 5) << "step " << step;
    EXPECT_EQ(s.ends_epoch(step), step % 5 == 4) << "step " << step;
  }
  const Schedule capped = MakeSchedule(103, 4, 5, 3, /*max_steps=*/7);
  EXPECT_TRUE(capped.ends_epoch(4));
  EXPECT_FALSE(capped.ends_epoch(5));
  EXPECT_TRUE(capped.ends_epoch(6));  // the job's last step
}

TEST(BatchSamplerTest, ReturnsBatchSizeIndices) {
  BatchSampler sampler(MakeSchedule(103, 4, 5, 2));
  for (int64_t step = 0; step < 10; ++step) {
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(sampler.Indices(step, rank).size(), 5u);
    }
  }
}

TEST(BatchSamplerTest, RanksTakeDisjointContiguousSlicesOfTheEpochOrder) {
  const Schedule s = MakeSchedule(103, 4, 5, 3);
  BatchSampler sampler(s);
  for (int64_t step = 0; step < s.total_steps(); ++step) {
    const int64_t epoch = s.epoch_of(step);
    const std::vector<int32_t> order =
        EpochOrder(s.seed, epoch, s.num_samples, s.shuffle);
    const int64_t g = step % s.steps_per_epoch();
    for (int rank = 0; rank < s.world_size; ++rank) {
      const auto begin =
          order.begin() + g * s.global_batch() + int64_t{rank} * s.batch_size;
      EXPECT_EQ(ToVector(sampler.Indices(step, rank)),
                std::vector<int32_t>(begin, begin + s.batch_size))
          << "step " << step << " rank " << rank;
    }
  }
}

TEST(BatchSamplerTest, EachSampleIsUsedAtMostOncePerEpoch) {
  const Schedule s = MakeSchedule(103, 4, 5, 2);
  BatchSampler sampler(s);
  for (int64_t epoch = 0; epoch < s.epochs; ++epoch) {
    std::set<int32_t> seen;
    for (int64_t g = 0; g < s.steps_per_epoch(); ++g) {
      for (int rank = 0; rank < s.world_size; ++rank) {
        for (int32_t i :
             sampler.Indices(epoch * s.steps_per_epoch() + g, rank)) {
          EXPECT_GE(i, 0);
          EXPECT_LT(i, s.num_samples);
          EXPECT_TRUE(seen.insert(i).second)
              << "sample " << i << " twice in epoch " << epoch;
        }
      }
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 100);  // 3 dropped
  }
}

TEST(BatchSamplerTest, NWorkersCoverTheSameSamplesAsOneWorkerWithNTimesBatch) {
  for (bool shuffle : {true, false}) {
    Schedule many = MakeSchedule(1000, 4, 16, 3);
    many.shuffle = shuffle;
    Schedule one = MakeSchedule(1000, 1, 64, 3);
    one.shuffle = shuffle;
    ASSERT_EQ(many.total_steps(), one.total_steps());
    BatchSampler many_sampler(many);
    BatchSampler one_sampler(one);
    for (int64_t step = 0; step < many.total_steps(); ++step) {
      std::vector<int32_t> joined;
      for (int rank = 0; rank < many.world_size; ++rank) {
        const auto part = many_sampler.Indices(step, rank);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(joined, ToVector(one_sampler.Indices(step, 0)))
          << "step " << step << " shuffle " << shuffle;
    }
  }
}

TEST(BatchSamplerTest, PositionIsAPureFunctionOfTheStep) {
  const Schedule s = MakeSchedule(103, 4, 5, 3);
  BatchSampler sequential(s);
  std::vector<std::vector<int32_t>> expected;
  for (int64_t step = 0; step < s.total_steps(); ++step) {
    expected.push_back(ToVector(sequential.Indices(step, 2)));
  }
  // A fresh sampler resuming anywhere, in any order, agrees.
  BatchSampler resumed(s);
  for (int64_t step : {11, 3, 14, 0, 7, 7, 12}) {
    EXPECT_EQ(ToVector(resumed.Indices(step, 2)), expected[step])
        << "step " << step;
  }
}

TEST(ValidateScheduleTest, AcceptsARunnableSchedule) {
  EXPECT_TRUE(ValidateSchedule(MakeSchedule(103, 4, 5, 3)).ok());
  EXPECT_TRUE(ValidateSchedule(MakeSchedule(20, 4, 5, 1)).ok());  // exactly one
}

void ExpectRejectedNaming(const Schedule& s, const std::string& field) {
  const absl::Status status = ValidateSchedule(s);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), absl::string_view::npos)
      << "expected the message to name " << field << ": " << status;
}

TEST(ValidateScheduleTest, RejectsBadValuesNamingTheField) {
  ExpectRejectedNaming(MakeSchedule(103, 0, 5, 1), "workers");
  ExpectRejectedNaming(MakeSchedule(103, -2, 5, 1), "workers");
  ExpectRejectedNaming(MakeSchedule(103, 4, 0, 1), "batch_size");
  ExpectRejectedNaming(MakeSchedule(103, 4, -1, 1), "batch_size");
  ExpectRejectedNaming(MakeSchedule(103, 4, 5, 0), "epochs");
  ExpectRejectedNaming(MakeSchedule(103, 4, 5, 1, /*max_steps=*/-1),
                       "max_steps");
}

TEST(ValidateScheduleTest, RejectsADataSetSmallerThanOneGlobalBatch) {
  const Schedule s = MakeSchedule(19, 4, 5, 1);
  ExpectRejectedNaming(s, "19");
  ExpectRejectedNaming(s, "batch_size");
  ExpectRejectedNaming(s, "workers");
}

}  // namespace
}  // namespace dp
