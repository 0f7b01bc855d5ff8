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

class StepStats {
 public:
  // `world` ranks; `start`: when the coordinator started (the arrival of a
  // rank that has not pushed yet).
  StepStats(int world, absl::Time start);

  // A push of `rank` that counts arrived at `t`.
  void Arrived(int rank, absl::Time t) { arrival_[rank] = t; }
  // `rank`'s push completed the step (the step waited for it last).
  void CompletedBy(int rank);
  void AddRead(absl::Duration d) { read_time_ += d; }
  void AddUse(absl::Duration d) { use_time_ += d; }
  ElasticCounts& counts() { return counts_; }

  // The update into version `step` ran from `begin` to `end`; `pushed`: by
  // rank, it pushed a block of the step (its wait ends at `end`).
  void Applied(int64_t step, absl::Time begin, absl::Time end,
               const std::vector<bool>& pushed);
  // Whether any update was applied since the start.
  bool any_applied() const { return first_applied_step_ >= 0; }

  const ElasticCounts& counts() const { return counts_; }
  int last_completed_by() const { return last_completed_by_; }
  // By rank: how many applied steps its push completed.
  const std::vector<int64_t>& completed_by() const { return completed_by_; }
  int64_t first_applied_step() const { return first_applied_step_; }
  absl::Time first_apply() const { return first_apply_; }
  absl::Time last_apply() const { return last_apply_; }
  int64_t applies() const { return applies_; }
  absl::Duration apply_time() const { return apply_time_; }
  absl::Duration read_time() const { return read_time_; }
  absl::Duration use_time() const { return use_time_; }
  // By rank: the time from its pushes to the updates, added up.
  const std::vector<absl::Duration>& wait_time() const { return wait_time_; }

 private:
  ElasticCounts counts_;
  int last_completed_by_ = -1;
  std::vector<int64_t> completed_by_;
  int64_t first_applied_step_ = -1;
  absl::Time first_apply_ = absl::InfinitePast();
  absl::Time last_apply_ = absl::InfinitePast();
  int64_t applies_ = 0;
  absl::Duration apply_time_;
  absl::Duration read_time_;
  absl::Duration use_time_;
  std::vector<absl::Time> arrival_;
  std::vector<absl::Duration> wait_time_;
};

}  // namespace dp

#endif  // DP_SERVER_STEP_STATS_H_
