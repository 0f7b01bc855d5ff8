// The step coordinator's counts of its steps.
#include "server/step_stats.h"

namespace dp {

StepStats::StepStats(int world, absl::Time start)
    : completed_by_(world, 0),
      arrival_(world, start),
      wait_time_(world, absl::ZeroDuration()) {}

void StepStats::CompletedBy(int rank) {
  last_completed_by_ = rank;
  ++completed_by_[rank];
}

void StepStats::Applied(int64_t step, absl::Time begin, absl::Time end,
                        const std::vector<bool>& pushed) {
  last_apply_ = end;
  apply_time_ += end - begin;
  ++applies_;
  for (size_t r = 0; r < arrival_.size(); ++r) {
    if (pushed[r]) wait_time_[r] += end - arrival_[r];
  }
  if (first_applied_step_ < 0) {
    first_applied_step_ = step;
    first_apply_ = end;
  }
}

}  // namespace dp
