// EvalRecord alone: the last report is kept, and the final one is seen.
#include "server/eval_record.h"

#include "gtest/gtest.h"

namespace dp {
namespace {

TEST(EvalRecordTest, TheLastReportIsKeptAndTheFinalOneSeen) {
  EvalRecord evals;
  EXPECT_FALSE(evals.has());
  EXPECT_FALSE(evals.final_came());
  EvalReport epoch;
  epoch.step = 10;
  epoch.accuracy = 0.5;
  epoch.num_samples = 100;
  evals.Record(epoch);
  EXPECT_TRUE(evals.has());
  EXPECT_FALSE(evals.final_came());
  EXPECT_EQ(evals.last().step, 10);
  EvalReport end = epoch;
  end.step = 20;
  end.final = true;
  end.num_samples = 0;  // no test set
  evals.Record(end);
  EXPECT_TRUE(evals.final_came());
  EXPECT_EQ(evals.last().step, 20);
  evals.Record(epoch);  // a late epoch report: the final one was seen
  EXPECT_TRUE(evals.final_came());
}

}  // namespace
}  // namespace dp
