// Which rank computes which of a step's blocks: the plan (the step's K
// micro-batches split among the ranks taking part), the work each rank is
// to compute now (its planned block, or one handed to it), the blocks of
// lost ranks handed on, stragglers left out of the next plan, and late
// blocks backed up. A plain class: StepCoordinator calls it under its one
// mutex (requires: that mutex held), reading the roster and the step's sums
// it is given.
#ifndef DP_SERVER_BLOCK_PLANNER_H_
#define DP_SERVER_BLOCK_PLANNER_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "common/micro_batch_tree.h"
#include "server/elastic_options.h"
#include "server/rank_roster.h"
#include "server/sum_tree.h"

namespace dp {

class BlockPlanner {
 public:
  // `roster` and `sums` must outlive the planner; `min_workers` is the
  // job's live minimum (JobConfig::live_minimum). Only the `lead` (shard 0)
  // hands lost ranks' blocks on; the other shards plan too, to say whom they
  // wait for.
  BlockPlanner(int micro_batches, int min_workers, bool lead,
               const RankRoster* roster, const SumTree* sums);

  // The options, and the current step's start by their clock.
  void Configure(const ElasticOptions& elastic, absl::Time step_start);

  // By rank.
  const std::vector<Block>& plan() const { return plan_; }
  const std::vector<Block>& work() const { return work_; }
  // Any rank has a block of the step.
  bool planned() const;
  // How many ranks the plan of the step before gave a block.
  int last_plan_blocks() const { return last_plan_blocks_; }
  // By rank: left out of the next plan. The late blocks handed again this
  // step, and how many backups it has left to give.
  const std::vector<bool>& stragglers() const { return straggler_; }
  const std::vector<Block>& backed_up() const { return backed_up_; }
  int backups_this_step() const { return backups_this_step_; }
  // By rank: it pushed a block this step.
  const std::vector<bool>& pushed() const { return pushed_; }
  // The ranks the step waits for: those whose work is not in; before a
  // plan (the step waits for workers), those not live.
  std::vector<int> WaitsFor() const;

  // The ranks a plan made now gives blocks to: the live ones, stragglers
  // only when nobody else is; none while `hold` (the first step waits for
  // everyone) or when fewer than --min_workers are.
  std::vector<int> TakingPart(bool hold) const;
  // Splits the step's blocks among `taking_part`, as their work too.
  void Plan(const std::vector<int>& taking_part);
  // Plans again for `taking_part` while no block of the step is in and
  // they changed (a rank joined or was lost before anyone pushed), and an
  // unplanned step (it waited for workers) once there are some, whatever
  // is in: a rank that computes its old block still pushes it (any node
  // counts).
  void Replan(const std::vector<int>& taking_part);

  // The blocks of lost ranks that are not in and that no live rank
  // computes (none below --min_workers, or without reassign).
  std::vector<Block> Orphans() const;
  // Gives `rank` the block it computes now: its own or one handed to it,
  // unless that is in; else a lost rank's block (counted in *reassigned).
  // Empty: none.
  Block AssignWork(int rank, int64_t* reassigned);

  // `rank` pushed `block` at `at`, which the step takes (called before
  // the sums do: the step's first push if none is in).
  void Pushed(int rank, const Block& block, absl::Time at);
  // `rank` computed `block` (a copy of one that is in): its work is done.
  void Computed(int rank, const Block& block);
  // The step was applied while these ranks were `waiting`: a rank that
  // had a block, pushed nothing and did not wait is a straggler (the next
  // plan leaves it out); one that pushed or waits in time takes part again.
  void Applied(const std::vector<bool>& waiting);
  // The next step starts at `start`: no backups yet, planned for
  // `taking_part`.
  void StartStep(absl::Time start, const std::vector<int>& taking_part);

  // When the step's next late block is due (its first push took 1/factor
  // of it, and at least the minimum wait; before any push, the step before
  // took 1/factor of it); InfiniteFuture on the first step before a push,
  // or when the step's backups are used up.
  absl::Time LateDue() const;
  // The first late block: one a rank computes, not in, not backed up yet,
  // its rank not `waiting`. Empty: none (then none more this step).
  Block LateBlock(const std::vector<bool>& waiting);
  // `rank` computes `late` as well.
  void BackUp(int rank, const Block& late);

 private:
  const int k_;
  const int min_workers_;
  const bool lead_;
  const RankRoster& roster_;
  const SumTree& sums_;
  ElasticOptions elastic_;
  // By rank: its planned block; the block it is to compute now (planned
  // or handed to it); a straggler (its planned block of the last step was
  // completed by another's copy).
  std::vector<Block> plan_;
  std::vector<Block> work_;
  std::vector<bool> straggler_;
  std::vector<Block> backed_up_;  // late, handed again
  std::vector<bool> pushed_;      // by rank, this step
  int backups_this_step_ = 0;
  absl::Time step_start_;
  absl::Duration last_step_;  // from the start of the step before to this
  absl::Time first_push_ = absl::InfiniteFuture();
  int last_plan_blocks_ = 0;
};

}  // namespace dp

#endif  // DP_SERVER_BLOCK_PLANNER_H_
