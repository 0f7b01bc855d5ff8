// Who computes which block of the step: plans, hand-overs and backups.
#include "server/block_planner.h"

#include <algorithm>

namespace dp {

BlockPlanner::BlockPlanner(int micro_batches, int min_workers, bool lead,
                           const RankRoster* roster, const SumTree* sums)
    : k_(micro_batches),
      min_workers_(min_workers),
      lead_(lead),
      roster_(*roster),
      sums_(*sums),
      plan_(roster->world()),
      work_(roster->world()),
      straggler_(roster->world(), false),
      pushed_(roster->world(), false) {}

void BlockPlanner::Configure(const ElasticOptions& elastic,
                             absl::Time step_start) {
  elastic_ = elastic;
  step_start_ = step_start;
}

bool BlockPlanner::planned() const {
  return std::any_of(plan_.begin(), plan_.end(),
                     [](const Block& b) { return !b.empty(); });
}

std::vector<int> BlockPlanner::TakingPart(bool hold) const {
  std::vector<int> part, with_stragglers;
  for (int r = 0; r < roster_.world(); ++r) {
    if (!roster_.Live(r)) continue;
    with_stragglers.push_back(r);
    if (!straggler_[r]) part.push_back(r);
  }
  // Stragglers only when nobody else is there.
  if (part.empty()) part = with_stragglers;
  // Too few: the step waits, every block unplanned until enough join. A
  // straggler is there, only slow: it counts, or a job whose minimum is
  // its world size would plan nothing once one rank was late, and never
  // apply the step that clears it.
  if (hold || static_cast<int>(with_stragglers.size()) < min_workers_) {
    part.clear();
  }
  return part;
}

void BlockPlanner::Plan(const std::vector<int>& taking_part) {
  plan_.assign(plan_.size(), Block{});
  work_.assign(work_.size(), Block{});
  const std::vector<Block> blocks =
      SplitForWorkers(k_, static_cast<int>(taking_part.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    plan_[taking_part[i]] = blocks[i];
    work_[taking_part[i]] = blocks[i];
  }
}

void BlockPlanner::Replan(const std::vector<int>& taking_part) {
  std::vector<int> planned;
  for (size_t r = 0; r < plan_.size(); ++r) {
    if (!plan_[r].empty()) planned.push_back(static_cast<int>(r));
  }
  if ((sums_.empty() && taking_part != planned) ||
      (planned.empty() && !taking_part.empty())) {
    Plan(taking_part);
  }
}

std::vector<Block> BlockPlanner::Orphans() const {
  std::vector<Block> orphans;
  if (!lead_ || !elastic_.reassign()) return orphans;
  int live = 0;
  for (int r = 0; r < roster_.world(); ++r) live += roster_.Live(r) ? 1 : 0;
  if (live < min_workers_) return orphans;
  // A block a lost rank was planned or handed that is not in and that no
  // live rank computes (a block handed on whose new rank was lost too is
  // an orphan again).
  auto computed = [this](const Block& b) {
    for (size_t r = 0; r < work_.size(); ++r) {
      if (roster_.Live(r) && work_[r].Contains(b)) return true;
    }
    return false;
  };
  for (size_t r = 0; r < plan_.size(); ++r) {
    if (!roster_.lost(r)) continue;
    for (const Block& b : {plan_[r], work_[r]}) {
      if (b.empty() || sums_.Covered(b) || computed(b) ||
          std::find(orphans.begin(), orphans.end(), b) != orphans.end()) {
        continue;
      }
      orphans.push_back(b);
    }
  }
  return orphans;
}

Block BlockPlanner::AssignWork(int rank, int64_t* reassigned) {
  if (!work_[rank].empty()) {
    if (!sums_.Covered(work_[rank])) return work_[rank];
    work_[rank] = Block{};
  }
  if (!roster_.Live(rank)) return Block{};
  const std::vector<Block> orphans = Orphans();
  if (orphans.empty()) return Block{};
  work_[rank] = orphans[0];
  ++*reassigned;
  return orphans[0];
}

void BlockPlanner::Pushed(int rank, const Block& block, absl::Time at) {
  if (sums_.empty()) first_push_ = at;
  pushed_[rank] = true;
  Computed(rank, block);
}

void BlockPlanner::Computed(int rank, const Block& block) {
  if (block.Contains(work_[rank])) work_[rank] = Block{};
}

void BlockPlanner::Applied(const std::vector<bool>& waiting) {
  const std::vector<bool>& received = pushed_;
  for (size_t r = 0; r < plan_.size(); ++r) {
    if (!plan_[r].empty() && !received[r] && !waiting[r]) {
      straggler_[r] = true;
    } else if (waiting[r] || received[r]) {
      straggler_[r] = false;
    }
  }
  last_plan_blocks_ = 0;
  for (const Block& b : plan_) last_plan_blocks_ += b.empty() ? 0 : 1;
}

void BlockPlanner::StartStep(absl::Time start,
                             const std::vector<int>& taking_part) {
  backed_up_.clear();
  backups_this_step_ = 0;
  pushed_.assign(pushed_.size(), false);
  last_step_ = start - step_start_;
  step_start_ = start;
  first_push_ = absl::InfiniteFuture();
  Plan(taking_part);
}

absl::Time BlockPlanner::LateDue() const {
  if (backups_this_step_ >= elastic_.backup_blocks) {
    return absl::InfiniteFuture();
  }
  // Without a push (every block with ranks that have not pushed, say one
  // rank with them all), the step before is the measure.
  absl::Duration measure = last_step_;
  if (first_push_ != absl::InfiniteFuture()) {
    measure = first_push_ - step_start_;
  } else if (last_step_ <= absl::ZeroDuration()) {
    return absl::InfiniteFuture();  // the first step: no measure yet
  }
  return step_start_ + std::max(elastic_.straggler_min_wait,
                                measure * elastic_.straggler_factor);
}

Block BlockPlanner::LateBlock(const std::vector<bool>& waiting) {
  for (size_t r = 0; r < work_.size(); ++r) {
    const Block b = work_[r];
    if (b.empty() || waiting[r] || sums_.Covered(b)) continue;
    if (std::find(backed_up_.begin(), backed_up_.end(), b) !=
        backed_up_.end()) {
      continue;
    }
    return b;
  }
  backups_this_step_ = elastic_.backup_blocks;  // nothing to back up
  return Block{};
}

void BlockPlanner::BackUp(int rank, const Block& late) {
  work_[rank] = late;
  backed_up_.push_back(late);
  ++backups_this_step_;
}

std::vector<int> BlockPlanner::WaitsFor() const {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(work_.size()); ++r) {
    const bool waits = planned() ? !work_[r].empty() && !sums_.Covered(work_[r])
                                 : !roster_.Live(r);
    if (waits) ranks.push_back(r);
  }
  return ranks;
}

}  // namespace dp
