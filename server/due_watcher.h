// A thread that does a thing each time it falls due, for a class whose state
// one mutex guards (the coordinator's straggler backups). Between times it
// sleeps on that mutex: whoever releases the mutex re-evaluates `sooner` (no
// thread switch per step where nothing falls due sooner), and otherwise it
// wakes when the clock says the thing is due.
#ifndef DP_SERVER_DUE_WATCHER_H_
#define DP_SERVER_DUE_WATCHER_H_

#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dp {

class DueWatcher {
 public:
  struct Calls {
    // Does what is due, taking the mutex itself; returns when the next
    // thing falls due (InfiniteFuture: nothing is planned).
    std::function<absl::Time()> run;
    // With the mutex held: the watch is over.
    std::function<bool()> stopped;
    // With the mutex held: something falls due sooner than `due`.
    std::function<bool(absl::Time due)> sooner;
    // With the mutex held: what `run`'s times are read from (a test's clock
    // moves when the test says; the thread then sleeps in real time for
    // what it says is left).
    std::function<absl::Time()> clock;
  };
  // Starts the thread.
  DueWatcher(absl::Mutex* mu, Calls calls);
  // Joins it: `stopped` must hold, or come to hold, first.
  ~DueWatcher();

  DueWatcher(const DueWatcher&) = delete;
  DueWatcher& operator=(const DueWatcher&) = delete;

 private:
  void Watch();

  absl::Mutex* const mu_;
  const Calls calls_;
  std::thread thread_;
};

}  // namespace dp

#endif  // DP_SERVER_DUE_WATCHER_H_
