// dp-ps's metrics over the shared registry (common/metrics.h).
#include "server/server_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/step_coordinator.h"

namespace dp {
namespace {

// absl::StatusCode::kOk .. kUnauthenticated
constexpr int kNumStatusCodes = 17;

// "invalid_argument" for kInvalidArgument: the bounded label value set.
std::string ReasonOf(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c <= 0 || c >= kNumStatusCodes) code = absl::StatusCode::kUnknown;
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

int64_t UnixNanos(absl::Time t) { return absl::ToUnixNanos(t); }

// Brings a counter that mirrors a cumulative count from *mirrored up to
// `count`; a count below it (never, from one coordinator) moves only the
// mark, as a counter cannot go down.
void Mirror(prometheus::Counter* counter, int64_t count, int64_t* mirrored) {
  if (count > *mirrored) {
    counter->Increment(static_cast<double>(count - *mirrored));
  }
  *mirrored = count;
}

}  // namespace

ServerMetrics::ServerMetrics(int world_size, int shard, int min_workers,
                             absl::Duration active_window,
                             std::function<absl::Time()> now)
    : Metrics("ps", -1, std::max(shard, 0)),
      world_size_(world_size),
      active_window_(active_window),
      now_(std::move(now)),
      last_seen_(new std::atomic<int64_t>[std::max(world_size, 0)]) {
  for (int r = 0; r < world_size_; ++r) {
    last_seen_[r].store(std::numeric_limits<int64_t>::min());
  }
  AddProgressMetrics();
  AddWorkerMetrics(min_workers);
  AddFailureMetrics();
  AddStepMetrics();
  AddElasticityMetrics();
  AddRejectionMetrics();
  AddEvaluationMetrics();
}

// The job's progress: steps, epochs, the training loss.
void ServerMetrics::AddProgressMetrics() {
  loss_ = &NewLossFamily();
  step_ = &NewGauge("dp_training_step",
                    "Updates applied so far, i.e. the version of the weights.");
  planned_steps_ =
      &NewGauge("dp_training_planned_steps",
                "Steps the job will run (0 until the first worker registers).");
  epoch_ =
      &NewGauge("dp_training_epoch",
                "1-based epoch of the step being trained (0 until known).");
}

// The workers the job needs and those it sees.
void ServerMetrics::AddWorkerMetrics(int min_workers) {
  expected_workers_ =
      &NewGauge("dp_ps_expected_workers", "Workers the job needs (--workers).");
  min_workers_ = &NewGauge(
      "dp_ps_min_workers",
      "Live workers below which steps wait (--min_workers, at least 1).");
  registered_workers_ = &NewGauge("dp_ps_registered_workers",
                                  "Ranks that have registered at least once.");
  active_workers_ =
      &NewGauge("dp_ps_active_workers",
                absl::StrFormat("Ranks that made a request in the last %s.",
                                absl::FormatDuration(active_window_)));
  expected_workers_->Set(world_size_);
  min_workers_->Set(std::max(min_workers, 1));
}

// A failed job and the checkpoints a restart would resume from.
void ServerMetrics::AddFailureMetrics() {
  failed_ = &NewGauge(
      "dp_training_failed",
      "1 once the job failed (a rank lost with --on_worker_loss=fail): "
      "dp-ps exits 1 after one more scrape.");
  checkpoint_interval_ = &NewGauge(
      "dp_ps_checkpoint_interval_steps",
      "Steps between checkpoints (--checkpoint_every; 0: at a stop and the "
      "end only, or no --checkpoint_dir).");
  checkpoint_step_ = &NewGauge(
      "dp_ps_checkpoint_step",
      "Step of the newest checkpoint on disk, the one a restart resumes "
      "from (0: none).");
  checkpoint_failures_ = &NewCounter(
      "dp_ps_checkpoint_write_failures_total",
      "Checkpoint writes that failed (disk full, read-only, file too "
      "large); training goes on from the last good checkpoint.");
}

// Where a step's time goes: the update and each rank's wait.
void ServerMetrics::AddStepMetrics() {
  update_seconds_ =
      &NewSeconds("dp_ps_update_duration_seconds",
                  "Time dp-ps takes to apply one update (the step's "
                  "tree sum over its micro-batches, divided by their count, "
                  "plus the Adam step).");
  auto& barrier = NewSecondsFamily(
      "dp_ps_barrier_wait_duration_seconds",
      "Per rank, from its arrival at the barrier (its push, for PushPull) "
      "to the update that releases it; the slowest rank waits least.");
  for (int r = 0; r < world_size_; ++r) {
    barrier_wait_.push_back(
        &barrier.Add({{"rank", absl::StrCat(r)}}, SecondsBuckets()));
  }
}

// Elastic training: the live ranks, the plan, blocks handed on.
void ServerMetrics::AddElasticityMetrics() {
  live_workers_ = &NewGauge(
      "dp_ps_live_workers",
      "Ranks registered and not lost: those the step's blocks are split "
      "among.");
  micro_batches_ = &NewGauge(
      "dp_ps_micro_batches",
      "Micro-batches per step: the leaves of the step's tree, split into "
      "blocks among the live ranks.");
  auto& planned = NewGaugeFamily(
      "dp_ps_planned_micro_batches",
      "Per rank, the micro-batches of its block in the current step's plan "
      "(0: none); blocks handed on later are not included.");
  auto& completed = NewCounterFamily(
      "dp_ps_steps_completed_by_total",
      "Per rank, applied steps whose last missing block the rank pushed: the "
      "rank each step waited for.");
  for (int r = 0; r < world_size_; ++r) {
    planned_micro_batches_.push_back(&planned.Add({{"rank", absl::StrCat(r)}}));
    steps_completed_by_.push_back(&completed.Add({{"rank", absl::StrCat(r)}}));
  }
  mirrored_.steps_completed_by.assign(std::max(world_size_, 0), 0);
  blocks_reassigned_ =
      &NewCounter("dp_ps_blocks_reassigned_total",
                  "Blocks of lost ranks handed to other ranks.");
  backup_blocks_ = &NewCounter(
      "dp_ps_backup_blocks_total",
      "Late blocks handed to an idle rank as well (straggler backups); the "
      "first copy in counts.");
  duplicate_pushes_ = &NewCounter(
      "dp_ps_duplicate_pushes_total",
      "Pushes of a block already in, while its step was open: copies "
      "computed after the first.");
}

void ServerMetrics::AddRejectionMetrics() {
  auto& rejected = NewCounterFamily(
      "dp_ps_rejected_requests_total",
      "Requests dp-ps refused, by status code (reason); a client cancelling "
      "its own wait is not counted.");
  rejected_.assign(kNumStatusCodes, nullptr);
  for (int c = 1; c < kNumStatusCodes; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (code == absl::StatusCode::kCancelled) continue;
    rejected_[c] = &rejected.Add({{"reason", ReasonOf(code)}});
  }
}

// Rank 0's evaluations of the weights.
void ServerMetrics::AddEvaluationMetrics() {
  test_accuracy_ = &NewGaugeFamily(
      "dp_test_accuracy",
      "Fraction of the test set classified correctly by the latest evaluated "
      "weights (rank 0 evaluates after every epoch).");
  test_loss_ = &NewGaugeFamily(
      "dp_test_loss",
      "Mean cross-entropy over the test set of the latest evaluated "
      "weights.");
}

void ServerMetrics::SawRank(int rank) {
  if (rank < 0 || rank >= world_size_) return;
  last_seen_[rank].store(UnixNanos(now_()), std::memory_order_relaxed);
}

void ServerMetrics::CountRejected(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled) {
    return;
  }
  int c = static_cast<int>(code);
  if (c <= 0 || c >= kNumStatusCodes) {
    c = static_cast<int>(absl::StatusCode::kUnknown);
  }
  rejected_[c]->Increment();
}

void ServerMetrics::ObserveBarrierWait(int rank, absl::Duration wait) {
  if (rank < 0 || rank >= world_size_) return;
  barrier_wait_[rank]->Observe(absl::ToDoubleSeconds(wait));
}

void ServerMetrics::ObserveUpdate(absl::Duration apply) {
  update_seconds_->Observe(absl::ToDoubleSeconds(apply));
}

void ServerMetrics::SetProgress(const Progress& p) {
  step_->Set(static_cast<double>(p.step));
  planned_steps_->Set(static_cast<double>(p.planned_steps));
  epoch_->Set(p.epoch);
  if (p.has_loss) loss_->Add({}).Set(p.loss);
  registered_workers_->Set(p.registered_workers);
  failed_->Set(p.failed ? 1 : 0);
  if (p.has_eval) {
    test_accuracy_->Add({}).Set(p.test_accuracy);
    test_loss_->Add({}).Set(p.test_loss);
  }
}

void ServerMetrics::SetCheckpoints(const Checkpoints& c) {
  checkpoint_interval_->Set(static_cast<double>(c.interval_steps));
  checkpoint_step_->Set(static_cast<double>(c.newest_step));
  absl::MutexLock lock(&checkpoint_mu_);
  Mirror(checkpoint_failures_, c.write_failures, &mirrored_failures_);
}

void ServerMetrics::SetElasticity(const Elasticity& e) {
  live_workers_->Set(e.live_workers);
  micro_batches_->Set(e.micro_batches);
  for (int r = 0; r < world_size_; ++r) {
    planned_micro_batches_[r]->Set(
        r < static_cast<int>(e.planned_micro_batches.size())
            ? e.planned_micro_batches[r]
            : 0);
  }
  absl::MutexLock lock(&elastic_mu_);
  Mirror(blocks_reassigned_, e.blocks_reassigned, &mirrored_.blocks_reassigned);
  Mirror(backup_blocks_, e.backup_blocks, &mirrored_.backup_blocks);
  Mirror(duplicate_pushes_, e.duplicate_pushes, &mirrored_.duplicate_pushes);
  for (int r = 0;
       r < world_size_ && r < static_cast<int>(e.steps_completed_by.size());
       ++r) {
    Mirror(steps_completed_by_[r], e.steps_completed_by[r],
           &mirrored_.steps_completed_by[r]);
  }
}

ServerMetrics::Elasticity ElasticityOf(const CoordinatorStatus& s) {
  ServerMetrics::Elasticity e;
  e.live_workers = static_cast<int>(s.live_ranks.size());
  e.micro_batches = s.micro_batches;
  for (const Block& b : s.plan) e.planned_micro_batches.push_back(b.count);
  e.blocks_reassigned = s.elastic.blocks_reassigned;
  e.backup_blocks = s.elastic.backups_handed;
  e.duplicate_pushes = s.elastic.duplicate_pushes;
  e.steps_completed_by = s.completed_by;
  return e;
}

int ServerMetrics::ActiveWorkers() const {
  const int64_t since = UnixNanos(now_() - active_window_);
  int active = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (last_seen_[r].load(std::memory_order_relaxed) >= since) ++active;
  }
  return active;
}

void ServerMetrics::BeforeScrape() { active_workers_->Set(ActiveWorkers()); }

}  // namespace dp
