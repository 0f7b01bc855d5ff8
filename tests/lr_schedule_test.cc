// The learning-rate schedules, against values worked out by hand.
#include "server/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace dp {
namespace {

AdamOptions WithSchedule(LrScheduleKind kind, int64_t warmup) {
  AdamOptions o;
  o.lr = 0.1;
  o.schedule.kind = kind;
  o.schedule.warmup_steps = warmup;
  return o;
}

TEST(LrScheduleTest, ConstantIsTheLearningRateAtEveryStep) {
  const AdamOptions o = WithSchedule(LrScheduleKind::kConstant, 0);
  for (int64_t t : {0, 1, 99, 12345}) EXPECT_EQ(ScheduledLr(o, t, 100), 0.1);
}

// Update t of a W-step warm-up runs at (t + 1) / W of the rate: the first
// at lr / W, update W - 1 and every one after at lr itself.
TEST(LrScheduleTest, WarmUpRisesLinearlyToTheRateAtStepW) {
  const AdamOptions o = WithSchedule(LrScheduleKind::kConstant, 4);
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 0, 100), 0.025);
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 1, 100), 0.05);
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 2, 100), 0.075);
  EXPECT_EQ(ScheduledLr(o, 3, 100), 0.1);
  EXPECT_EQ(ScheduledLr(o, 50, 100), 0.1);
}

// Cosine from lr at update 0 through the midpoint (lr + lr_min) / 2 at T/2
// towards lr_min at T; update T - 1 is the last and still above lr_min.
TEST(LrScheduleTest, CosineFallsFromTheRateToTheMinimumOverTheJob) {
  AdamOptions o = WithSchedule(LrScheduleKind::kCosine, 0);
  o.schedule.lr_min = 0.01;
  EXPECT_EQ(ScheduledLr(o, 0, 100), 0.1);
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 50, 100), 0.055);
  EXPECT_DOUBLE_EQ(ScheduledLr(o, 25, 100),
                   0.01 + 0.09 * 0.5 * (1 + std::sqrt(0.5)));
  EXPECT_GT(ScheduledLr(o, 99, 100), 0.01);
  EXPECT_NEAR(ScheduledLr(o, 99, 100), 0.01, 1e-4);
  for (int64_t t = 1; t < 100; ++t) {
    EXPECT_LT(ScheduledLr(o, t, 100), ScheduledLr(o, t - 1, 100)) << t;
  }
}

// The warm-up multiplies the cosine: at update 1 of a 4-step warm-up the
// cosine part is already below lr.
TEST(LrScheduleTest, WarmUpScalesTheDecayedRate) {
  AdamOptions o = WithSchedule(LrScheduleKind::kCosine, 4);
  AdamOptions plain = o;
  plain.schedule.warmup_steps = 0;
  EXPECT_EQ(ScheduledLr(o, 1, 10), 0.5 * ScheduledLr(plain, 1, 10));
  EXPECT_EQ(ScheduledLr(o, 7, 10), ScheduledLr(plain, 7, 10));
}

TEST(LrScheduleTest, StepDecaysByGammaEverySSteps) {
  AdamOptions o = WithSchedule(LrScheduleKind::kStep, 0);
  o.schedule.step_every = 3;
  o.schedule.gamma = 0.5;
  const double want[] = {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025};
  for (int64_t t = 0; t < 7; ++t) EXPECT_EQ(ScheduledLr(o, t, 100), want[t]);
}

TEST(LrScheduleTest, NamesParseBackAndOthersAreRefused) {
  for (LrScheduleKind kind : {LrScheduleKind::kConstant,
                              LrScheduleKind::kCosine, LrScheduleKind::kStep}) {
    auto parsed = ParseLrSchedule(LrScheduleName(kind));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, kind);
  }
  const auto bad = ParseLrSchedule("linear");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'linear'"), std::string::npos);
}

}  // namespace
}  // namespace dp
