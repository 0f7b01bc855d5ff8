// DueWatcher alone: it runs at once, sleeps while nothing is due, is woken
// by whoever releases the mutex when something falls due sooner, and ends
// when told to.
#include "server/due_watcher.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dp {
namespace {

TEST(DueWatcherTest, RunsAgainWhenSomethingFallsDueSoonerAndStops) {
  absl::Mutex mu;
  int runs = 0;
  bool stopped = false;
  absl::Time next = absl::InfiniteFuture();  // when something is due
  {
    DueWatcher watcher(
        &mu, DueWatcher::Calls{[&] {
                                 absl::MutexLock lock(&mu);
                                 ++runs;  // does what is due
                                 next = absl::InfiniteFuture();
                                 return next;
                               },
                               [&] { return stopped; },
                               [&](absl::Time due) { return next < due; },
                               [] { return absl::Now(); }});
    auto ran = [&](int n) { return [&runs, n] { return runs >= n; }; };
    {
      absl::MutexLock lock(&mu);
      auto once = ran(1);
      mu.Await(absl::Condition(&once));
      EXPECT_EQ(runs, 1) << "nothing was due: no second run";
      next = absl::Now();  // due now: the unlock below wakes the watcher
    }
    {
      absl::MutexLock lock(&mu);
      auto twice = ran(2);
      mu.Await(absl::Condition(&twice));
      stopped = true;
    }
  }  // joined
  EXPECT_EQ(runs, 2);
}

}  // namespace
}  // namespace dp
