// RankRoster alone: which rank a worker gets, whose session a close ends,
// what renews a lease and what CheckLeases reports.
#include "server/rank_roster.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dp {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);
const absl::Duration kLease = absl::Seconds(10);
const std::vector<bool> kNoneWaiting(3, false);

TEST(RankRosterTest, ARanklessWorkerGetsItsOwnThenThePreferredThenAFreeRank) {
  RankRoster roster(3, kStart);
  EXPECT_EQ(roster.Choose("a", -1, kStart, kNoneWaiting, kLease), 0);
  roster.Register(0, "a", kStart);
  roster.Register(2, "c", kStart);
  EXPECT_EQ(roster.Choose("c", 1, kStart, kNoneWaiting, kLease), 2)
      << "the rank its worker id registered";
  EXPECT_EQ(roster.Choose("b", 1, kStart, kNoneWaiting, kLease), 1);
  EXPECT_EQ(roster.Choose("b", 0, kStart, kNoneWaiting, kLease), 1)
      << "0 is held: the lowest never registered";
  roster.Register(1, "b", kStart);
  EXPECT_EQ(roster.Choose("d", -1, kStart, kNoneWaiting, kLease), -1);
  // Rank 1's lease runs out, rank 0's does not while it waits in a call.
  const absl::Time later = kStart + 2 * kLease;
  EXPECT_EQ(roster.Choose("d", -1, later, {true, false, true}, kLease), 1);
  EXPECT_TRUE(roster.AttendingRanks(later, {true, false, true}, kLease).empty())
      << "none attended";
  roster.Attended(0);
  roster.Attended(2);
  EXPECT_EQ(roster.AttendingRanks(later, {true, false, true}, kLease),
            (std::vector<int>{0, 2}));
  // A registration again (a re-join) is seen as it was: it attends again.
  roster.Register(2, "c", later);
  EXPECT_EQ(roster.AttendingRanks(later, {true, false, true}, kLease),
            (std::vector<int>{0, 2}));
}

TEST(RankRosterTest, OnlyItsHolderMayRegisterAHeldRankAgain) {
  RankRoster roster(3, kStart);
  roster.Register(0, "host/1", kStart);
  const absl::Status taken =
      roster.CheckFree(0, "host/2", kStart, /*waiting=*/false, kLease);
  EXPECT_EQ(taken.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(taken.message().find("host/1"), std::string::npos) << taken;
  EXPECT_TRUE(roster.CheckFree(0, "host/1", kStart, false, kLease).ok());
  EXPECT_TRUE(roster.CheckFree(1, "host/2", kStart, false, kLease).ok());
  // Its lease ran out: free, unless it waits in a call.
  const absl::Time later = kStart + 2 * kLease;
  EXPECT_TRUE(roster.CheckFree(0, "host/2", later, false, kLease).ok());
  EXPECT_FALSE(roster.CheckFree(0, "host/2", later, true, kLease).ok());
}

TEST(RankRosterTest, OnlyTheCurrentSessionsCloseCounts) {
  RankRoster roster(3, kStart);
  const uint64_t old = roster.Register(0, "a", kStart);
  const uint64_t now = roster.Register(0, "a", kStart);
  EXPECT_NE(old, now);
  EXPECT_NE(now, 0u);
  EXPECT_FALSE(roster.Close(0, old));
  EXPECT_FALSE(roster.closed(0));
  EXPECT_FALSE(roster.Close(1, now)) << "not registered";
  EXPECT_TRUE(roster.Close(0, now));
  EXPECT_TRUE(roster.closed(0));
  EXPECT_FALSE(roster.Held(0, kStart, false, kLease));
  roster.Register(0, "a", kStart);
  EXPECT_FALSE(roster.closed(0)) << "a new registration's connection";
}

TEST(RankRosterTest, ACallAfterTheCloseRevivesNoRankButOneAfterSilenceDoes) {
  RankRoster roster(3, kStart);
  const uint64_t s0 = roster.Register(0, "a", kStart);
  roster.Register(1, "b", kStart);
  roster.Close(0, s0);
  roster.MarkLost(0);
  const absl::Time later = kStart + 2 * kLease;
  std::vector<LeaseEvent> events =
      roster.CheckLeases(later, kNoneWaiting, kLease, /*reassign=*/true);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].rank, 0);
  EXPECT_EQ(events[0].kind, LeaseEvent::kMissing);
  EXPECT_TRUE(events[0].closed);
  EXPECT_EQ(events[1].rank, 1);
  EXPECT_EQ(events[1].kind, LeaseEvent::kMissing);
  EXPECT_FALSE(events[1].closed);
  EXPECT_EQ(events[2].kind, LeaseEvent::kNeverRegistered);
  EXPECT_TRUE(roster.lost(1));
  roster.Renew(0, later);
  roster.Renew(1, later);
  EXPECT_TRUE(roster.lost(0));
  EXPECT_FALSE(roster.lost(1));
  events = roster.CheckLeases(later, kNoneWaiting, kLease, true);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].rank, 1);
  EXPECT_EQ(events[0].kind, LeaseEvent::kBack);
  EXPECT_EQ(events[0].silent, 2 * kLease);
}

TEST(RankRosterTest, AllToldWaitsForNoClosedOrLostRank) {
  RankRoster roster(3, kStart);
  const uint64_t s0 = roster.Register(0, "a", kStart);
  roster.Register(1, "b", kStart);
  EXPECT_FALSE(roster.AllTold());
  roster.Tell(1);
  EXPECT_FALSE(roster.AllTold());
  roster.Close(0, s0);
  EXPECT_TRUE(roster.AllTold()) << "rank 0 can hear nothing more";
}

}  // namespace
TEST(RankRosterTest, OnlyTheRegistrationsOwnSessionAttends) {
  RankRoster roster(2, kStart);
  EXPECT_EQ(roster.CheckRegistered(1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(roster.Attend(1, 7).code(), absl::StatusCode::kFailedPrecondition);
  const uint64_t first = roster.Register(1, "w", kStart);
  EXPECT_TRUE(roster.CheckRegistered(1).ok());
  const uint64_t second = roster.Register(1, "w", kStart);
  ASSERT_NE(first, second);
  const absl::Status stale = roster.Attend(1, first);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("registered again"), absl::string_view::npos)
      << stale;
  EXPECT_FALSE(roster.attended()[1]);
  EXPECT_TRUE(roster.Attend(1, second).ok());
  EXPECT_TRUE(roster.attended()[1]);
}

}  // namespace dp
