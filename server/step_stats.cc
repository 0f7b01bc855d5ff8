// The step coordinator's counts of its steps.
#include "server/step_stats.h"

namespace dp {

StepStats::StepStats(int world, absl::Time start)
    : completed_by_(world, 0), arrival_(world, start) {
  times_.wait_time.assign(world, absl::ZeroDuration());
}

void StepStats::CompletedBy(int rank) {
  last_completed_by_ = rank;
  ++completed_by_[rank];
}

void StepStats::Applied(int64_t step, absl::Time begin, absl::Time end,
                        const std::vector<bool>& pushed, absl::Duration cpu) {
  StepTimes& t = times_;
  t.last_apply = end;
  t.last_apply_cpu = cpu;
  t.apply_time += end - begin;
  ++t.applies;
  for (size_t r = 0; r < arrival_.size(); ++r) {
    if (pushed[r]) t.wait_time[r] += end - arrival_[r];
  }
  if (t.first_applied_step < 0) {
    t.first_applied_step = step;
    t.first_apply = end;
    t.first_apply_cpu = cpu;
  }
}

}  // namespace dp
