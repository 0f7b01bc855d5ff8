// WaitQueue on its own: waits are taken out oldest first with their
// callbacks, a rank's oldest wait gives way past its limit, and a
// cancelled wait is gone without being ended.
#include "server/wait_queue.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

// A callback that records its name when run.
WaitQueue::Callback Named(std::vector<std::string>* ran, std::string name) {
  return [ran, name](const absl::Status&, int64_t, Block) {
    ran->push_back(name);
  };
}

TEST(WaitQueueTest, WaitsAreTakenOutOldestFirstByWhatTheyWaitFor) {
  std::vector<std::string> ran;
  WaitQueue q(3);
  std::vector<WaitQueue::Wake> none;
  q.Add(2, 5, Named(&ran, "2@5"), 4, &none);
  q.Add(0, 4, Named(&ran, "0@4"), 4, &none);
  q.Add(1, 5, Named(&ran, "1@5"), 4, &none);
  EXPECT_EQ(q.Waiting(), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(q.List(),
            (std::vector<std::pair<int, int64_t>>{{2, 5}, {0, 4}, {1, 5}}));
  EXPECT_TRUE(q.Any([](int, int64_t step) { return step == 4; }));
  for (WaitQueue::Taken& t :
       q.TakeWhere([](int, int64_t step) { return step == 5; })) {
    t.done(absl::OkStatus(), t.step, Block{});
  }
  EXPECT_EQ(ran, (std::vector<std::string>{"2@5", "1@5"}));
  EXPECT_EQ(q.Waiting(), (std::vector<bool>{true, false, false}));
  EXPECT_FALSE(q.TakeFirst([](int rank, int64_t) { return rank == 1; }));
  std::optional<WaitQueue::Taken> first =
      q.TakeFirst([](int rank, int64_t) { return rank == 0; });
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->rank, 0);
  EXPECT_EQ(first->step, 4);
  EXPECT_TRUE(q.List().empty());
}

TEST(WaitQueueTest, ARanksOldestWaitGivesWayAndACancelledOneIsGone) {
  std::vector<std::string> ran;
  WaitQueue q(2);
  std::vector<WaitQueue::Wake> evicted;
  const int64_t a = q.Add(1, 7, Named(&ran, "a"), 2, &evicted);
  q.Add(0, 7, Named(&ran, "other rank"), 2, &evicted);
  const int64_t b = q.Add(1, 7, Named(&ran, "b"), 2, &evicted);
  EXPECT_TRUE(evicted.empty());
  EXPECT_LT(a, b);
  q.Add(1, 7, Named(&ran, "c"), 2, &evicted);
  ASSERT_EQ(evicted.size(), 1u);  // rank 1 had 2: its oldest, a, goes
  EXPECT_EQ(evicted[0].status.code(), absl::StatusCode::kAborted);
  WaitQueue::Run(evicted);
  EXPECT_EQ(ran, (std::vector<std::string>{"a"}));
  EXPECT_FALSE(q.Cancel(a));
  EXPECT_TRUE(q.Cancel(b));
  EXPECT_FALSE(q.Cancel(b));
  std::vector<WaitQueue::Taken> all = q.TakeAll();
  ASSERT_EQ(all.size(), 2u);
  for (WaitQueue::Taken& t : all) t.done(absl::OkStatus(), 7, Block{});
  EXPECT_EQ(ran, (std::vector<std::string>{"a", "other rank", "c"}));
  EXPECT_EQ(q.Waiting(), (std::vector<bool>{false, false}));
}

}  // namespace
TEST(WaitQueueTest, WakesEndTheWaitsTheyTakeWithTheirStatusAndWork) {
  std::vector<std::string> ran;
  WaitQueue q(3);
  std::vector<WaitQueue::Wake> none;
  q.Add(0, 4, Named(&ran, "0@4"), 4, &none);
  q.Add(1, 5, Named(&ran, "1@5"), 4, &none);
  q.Add(2, 5, Named(&ran, "2@5"), 4, &none);
  // Step 4 applied (the job is at 5): only the wait for 4 ends, OK at 5.
  std::vector<WaitQueue::Wake> applied = q.WakeApplied(5);
  ASSERT_EQ(applied.size(), 1u);
  EXPECT_TRUE(applied[0].status.ok());
  EXPECT_EQ(applied[0].step, 5);
  WaitQueue::Run(applied);
  EXPECT_EQ(ran, (std::vector<std::string>{"0@4"}));
  // Work for rank 2 only: rank 1's wait stays, asked once.
  std::vector<int> asked;
  std::vector<WaitQueue::Wake> work = q.WakeWithWork(5, [&](int rank) {
    asked.push_back(rank);
    return rank == 2 ? Block{1, 1} : Block{};
  });
  EXPECT_EQ(asked, (std::vector<int>{1, 2}));
  ASSERT_EQ(work.size(), 1u);
  EXPECT_EQ(work[0].work, (Block{1, 1}));
  EXPECT_EQ(q.List(), (std::vector<std::pair<int, int64_t>>{{1, 5}}));
  std::vector<WaitQueue::Wake> all =
      q.WakeAll(absl::UnavailableError("stop"), 5);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(q.List().empty());
}

}  // namespace dp
