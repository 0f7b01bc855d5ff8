// The backups of a step's stragglers: once the step's next late block
// falls due (BlockPlanner::LateDue) while a live rank waits idle for work,
// that rank computes the late block as well, and the first copy in counts.
// A plain class: StepCoordinator calls it under its mutex (its DueWatcher
// thread is what wakes when a block falls due).
#ifndef DP_SERVER_STRAGGLER_BACKUPS_H_
#define DP_SERVER_STRAGGLER_BACKUPS_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "server/block_planner.h"
#include "server/rank_roster.h"
#include "server/step_stats.h"
#include "server/wait_queue.h"

namespace dp {

class StragglerBackups {
 public:
  // All must outlive this.
  StragglerBackups(BlockPlanner* planner, WaitQueue* waits,
                   const RankRoster* roster, StepStats* stats);

  // When the next late block of `step` falls due; InfiniteFuture while no
  // live rank waits idle at it (nobody to back it up).
  absl::Time NextDue(int64_t step) const;
  // Hands the first late block of `step` to the oldest idle wait at it:
  // that wait's wake, or none.
  std::vector<WaitQueue::Wake> BackUpOne(int64_t step);

 private:
  bool Idle(int rank, int64_t wait_step, int64_t step) const;

  BlockPlanner& planner_;
  WaitQueue& waits_;
  const RankRoster& roster_;
  StepStats& stats_;
};

}  // namespace dp

#endif  // DP_SERVER_STRAGGLER_BACKUPS_H_
