#include "server/straggler_backups.h"

#include <optional>
#include <utility>

namespace dp {

StragglerBackups::StragglerBackups(BlockPlanner* planner, WaitQueue* waits,
                                   const RankRoster* roster, StepStats* stats)
    : planner_(*planner), waits_(*waits), roster_(*roster), stats_(*stats) {}

bool StragglerBackups::Idle(int rank, int64_t wait_step, int64_t step) const {
  return wait_step == step && !roster_.lost(rank);
}

absl::Time StragglerBackups::NextDue(int64_t step) const {
  const bool idle =
      waits_.Any([&](int rank, int64_t s) { return Idle(rank, s, step); });
  return idle ? planner_.LateDue() : absl::InfiniteFuture();
}

std::vector<WaitQueue::Wake> StragglerBackups::BackUpOne(int64_t step) {
  const Block late = planner_.LateBlock(waits_.Waiting());
  if (late.empty()) return {};
  std::optional<WaitQueue::Taken> idle = waits_.TakeFirst(
      [&](int rank, int64_t s) { return Idle(rank, s, step); });
  if (!idle.has_value()) return {};
  planner_.BackUp(idle->rank, late);
  ++stats_.counts().backups_handed;
  std::vector<WaitQueue::Wake> wakes;
  wakes.push_back(
      WaitQueue::Wake{std::move(idle->done), absl::OkStatus(), step, late});
  return wakes;
}

}  // namespace dp
