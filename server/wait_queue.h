// The waits of a step coordinator: the calls of ranks waiting for a step to
// be applied, or for work at it, oldest first, each with the callback that
// ends it. Taking a wait out hands back its callback, which the caller runs
// once its own lock is released. A plain class: StepCoordinator calls it
// under its mutex.
#ifndef DP_SERVER_WAIT_QUEUE_H_
#define DP_SERVER_WAIT_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/micro_batch_tree.h"

namespace dp {

class WaitQueue {
 public:
  using Callback =
      std::function<void(const absl::Status&, int64_t step, Block work)>;
  // A wait taken out: whose, for which step, and the callback that ends it.
  struct Taken {
    int rank;
    int64_t step;
    Callback done;
  };

  // How a wait taken out ends; run once the caller's lock is released.
  struct Wake {
    Callback done;
    absl::Status status;
    int64_t step = 0;
    Block work;
  };
  static void Run(std::vector<Wake>& wakes);

  explicit WaitQueue(int world) : of_rank_(world, 0) {}

  // Adds a wait of `rank` for `step` and returns its id (ids grow with
  // time). A rank with `max_per_rank` waits already loses its oldest, whose
  // wake (ABORTED) is added to *evicted.
  int64_t Add(int rank, int64_t step, Callback done, int max_per_rank,
              std::vector<Wake>* evicted);
  // Takes the wait `id` out without ending it; false if it is not there.
  bool Cancel(int64_t id);

  // Takes out, oldest first, the waits for which take(rank, step) is true.
  std::vector<Taken> TakeWhere(
      absl::FunctionRef<bool(int rank, int64_t step)> take);
  // Takes out the oldest wait for which take(rank, step) is true, if any.
  std::optional<Taken> TakeFirst(
      absl::FunctionRef<bool(int rank, int64_t step)> take);
  // Takes out every wait.
  std::vector<Taken> TakeAll();

  // The waits for steps before `step` (just applied), to end OK at it.
  std::vector<Wake> WakeApplied(int64_t step);
  // The waits for `step` of ranks that `work` gives a block (called once
  // for each, oldest first), to end with that block.
  std::vector<Wake> WakeWithWork(int64_t step,
                                 absl::FunctionRef<Block(int rank)> work);
  // Every wait, to end with `status` at `step`.
  std::vector<Wake> WakeAll(const absl::Status& status, int64_t step);

  // Whether some wait has take(rank, step) true.
  bool Any(absl::FunctionRef<bool(int rank, int64_t step)> which) const;
  // By rank: it has a wait.
  std::vector<bool> Waiting() const;
  // (rank, step) of every wait, oldest first.
  std::vector<std::pair<int, int64_t>> List() const;

 private:
  struct Waiter {
    int rank;
    int64_t step;
    Callback done;
  };
  Taken TakeOut(std::map<int64_t, Waiter>::iterator& it);

  std::map<int64_t, Waiter> waiters_;  // by id = age
  std::vector<int> of_rank_;           // waits by rank
  int64_t next_id_ = 1;
};

}  // namespace dp

#endif  // DP_SERVER_WAIT_QUEUE_H_
