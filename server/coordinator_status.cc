// StepCoordinator::Status, kept apart from the step's logic: a read of the
// plain classes' state, under the coordinator's lock.
#include "server/coordinator_status.h"

#include "server/step_coordinator.h"

namespace dp {

CoordinatorStatus StepCoordinator::Status() const {
  absl::ReaderMutexLock lock(&mu_);
  CoordinatorStatus s;
  s.config = config_;
  s.shard = shard_;
  s.generation = generation_;
  s.holds_previous = weights_.holds_previous();
  s.step = state_.step;
  s.total_steps = TotalStepsLocked();
  for (int r = 0; r < config_.schedule.world_size; ++r) {
    if (roster_.registered(r)) s.registered_ranks.push_back(r);
    if (planner_.pushed()[r]) s.pushed_ranks.push_back(r);
    if (roster_.Live(r)) s.live_ranks.push_back(r);
  }
  s.waits_for = planner_.WaitsFor();
  s.plan = planner_.plan();
  s.micro_batches = K();
  s.elastic = stats_.counts();
  s.last_completed_by = stats_.last_completed_by();
  s.completed_by = stats_.completed_by();
  s.last_plan_blocks = planner_.last_plan_blocks();
  s.done = OverLocked();
  s.failed = !failed_.ok();
  s.last_loss = last_loss_;
  s.has_eval = evals_.has();
  s.last_eval = evals_.last();
  s.times = stats_.times();
  s.snapshots = weights_.snapshots_made();
  return s;
}

}  // namespace dp
