// What the step coordinator counts of its steps, for dp-ps's end line and
// its metrics: where a step's time goes (the update, reading pushes, using
// the weights, each rank's wait from its push to the update), which rank's
// push completed each step, and how often blocks were reassigned, backed
// up or pushed twice. A plain class: StepCoordinator calls it under its
// mutex, and it takes no lock of its own.
#ifndef DP_SERVER_STEP_STATS_H_
#define DP_SERVER_STEP_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace dp {

struct ElasticCounts {
  int64_t blocks_reassigned = 0;  // of lost ranks, handed to others
  int64_t backups_handed = 0;     // late blocks handed to an idle rank
  int64_t duplicate_pushes = 0;   // copies that came after the first
};

// Where a step's time goes on the server, since the start.
struct StepTimes {
  // When the first and the latest update of this process were applied: the
  // training rate without start-up and data loading (-1: none yet).
  int64_t first_applied_step = -1;
  absl::Time first_apply = absl::InfinitePast();
  absl::Time last_apply = absl::InfinitePast();
  int64_t applies = 0;
  // The update itself; reading the pushes' gradients (checked and summed as
  // read; every push, all ranks); what WithCurrentWeights' callers did with
  // the weights (publishing them into shared memory).
  absl::Duration apply_time;
  absl::Duration read_time;
  absl::Duration use_time;
  // By rank: the time from its pushes to the updates, added up.
  std::vector<absl::Duration> wait_time;
  // The process's CPU time at the first and the latest update.
  absl::Duration first_apply_cpu;
  absl::Duration last_apply_cpu;
};

class StepStats {
 public:
  // `world` ranks; `start`: when the coordinator started (the arrival of a
  // rank that has not pushed yet).
  StepStats(int world, absl::Time start);

  // A push of `rank` that counts arrived at `t`.
  void Arrived(int rank, absl::Time t) { arrival_[rank] = t; }
  // `rank`'s push completed the step (the step waited for it last).
  void CompletedBy(int rank);
  void AddRead(absl::Duration d) { times_.read_time += d; }
  void AddUse(absl::Duration d) { times_.use_time += d; }
  ElasticCounts& counts() { return counts_; }

  // The update into version `step` ran from `begin` to `end`, when the
  // process had used `cpu`; `pushed`: by rank, it pushed a block of the
  // step (its wait ends at `end`).
  void Applied(int64_t step, absl::Time begin, absl::Time end,
               const std::vector<bool>& pushed, absl::Duration cpu);
  // Whether any update was applied since the start.
  bool any_applied() const { return times_.first_applied_step >= 0; }

  const ElasticCounts& counts() const { return counts_; }
  int last_completed_by() const { return last_completed_by_; }
  // By rank: how many applied steps its push completed.
  const std::vector<int64_t>& completed_by() const { return completed_by_; }
  const StepTimes& times() const { return times_; }

 private:
  ElasticCounts counts_;
  int last_completed_by_ = -1;
  std::vector<int64_t> completed_by_;
  StepTimes times_;
  std::vector<absl::Time> arrival_;
};

}  // namespace dp

#endif  // DP_SERVER_STEP_STATS_H_
