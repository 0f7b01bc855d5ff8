// Learning-rate schedules.
#include "server/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dp {

double ScheduledLr(const AdamOptions& o, int64_t t, int64_t total_steps) {
  const LrSchedule& s = o.schedule;
  const double warm =
      s.warmup_steps > 0
          ? std::min(1.0, static_cast<double>(t + 1) /
                              static_cast<double>(s.warmup_steps))
          : 1.0;
  double base = o.lr;
  switch (s.kind) {
    case LrScheduleKind::kConstant:
      break;
    case LrScheduleKind::kCosine:
      if (total_steps > 0) {
        base =
            s.lr_min + (o.lr - s.lr_min) * 0.5 *
                           (1.0 + std::cos(M_PI * static_cast<double>(t) /
                                           static_cast<double>(total_steps)));
      }
      break;
    case LrScheduleKind::kStep:
      base =
          o.lr * std::pow(s.gamma, static_cast<double>(
                                       t / std::max<int64_t>(s.step_every, 1)));
      break;
  }
  return warm * base;
}

const char* LrScheduleName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kCosine:
      return "cosine";
    case LrScheduleKind::kStep:
      return "step";
    case LrScheduleKind::kConstant:
      break;
  }
  return "constant";
}

absl::StatusOr<LrScheduleKind> ParseLrSchedule(absl::string_view name) {
  for (LrScheduleKind kind : {LrScheduleKind::kConstant,
                              LrScheduleKind::kCosine, LrScheduleKind::kStep}) {
    if (name == LrScheduleName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown learning-rate schedule '", name,
                   "' (constant | cosine | step)"));
}

}  // namespace dp
