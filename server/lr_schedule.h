// The learning rate of each update: warm-up, then constant, cosine or step
// decay, as torch.optim.lr_scheduler.LambdaLR stepped after every update.
#ifndef DP_SERVER_LR_SCHEDULE_H_
#define DP_SERVER_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job_config.h"

namespace dp {

// The rate of the update of step t (0-based: the one that turns weights
// version t into t + 1) in a job of `total_steps` updates, in double:
//   lr_t = warm(t) * base(t),  warm(t) = min(1, (t + 1) / W)  (1 if W = 0)
//   constant: base(t) = lr
//   cosine:   base(t) = lr_min + (lr - lr_min) * 0.5 * (1 + cos(pi * t / T))
//   step:     base(t) = lr * gamma^floor(t / step_every)
// with the operations in that order (tests/golden/make_adam_golden.py
// computes the same expressions). A cosine job of no steps keeps lr.
double ScheduledLr(const AdamOptions& o, int64_t t, int64_t total_steps);

// "constant" | "cosine" | "step", as --lr_schedule spells them.
const char* LrScheduleName(LrScheduleKind kind);
// The kind --lr_schedule names; INVALID_ARGUMENT listing the choices.
absl::StatusOr<LrScheduleKind> ParseLrSchedule(absl::string_view name);

}  // namespace dp

#endif  // DP_SERVER_LR_SCHEDULE_H_
