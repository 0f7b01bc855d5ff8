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

}  // namespace

ServerMetrics::ServerMetrics(int world_size, int shard,
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
  loss_ = &NewLossFamily();
  step_ = &NewGauge("dp_training_step",
                    "Updates applied so far, i.e. the version of the weights.");
  planned_steps_ =
      &NewGauge("dp_training_planned_steps",
                "Steps the job will run (0 until the first worker registers).");
  epoch_ =
      &NewGauge("dp_training_epoch",
                "1-based epoch of the step being trained (0 until known).");
  expected_workers_ =
      &NewGauge("dp_ps_expected_workers", "Workers the job needs (--workers).");
  registered_workers_ = &NewGauge("dp_ps_registered_workers",
                                  "Ranks that have registered at least once.");
  active_workers_ =
      &NewGauge("dp_ps_active_workers",
                absl::StrFormat("Ranks that made a request in the last %s.",
                                absl::FormatDuration(active_window_)));
  expected_workers_->Set(world_size_);
  update_seconds_ =
      &NewSeconds("dp_ps_update_duration_seconds",
                  "Time dp-ps takes to apply one update (rank-ordered "
                  "average of the gradients plus the Adam step).");
  auto& barrier = NewSecondsFamily(
      "dp_ps_barrier_wait_duration_seconds",
      "Per rank, from its arrival at the barrier (its push, for PushPull) "
      "to the update that releases it; the slowest rank waits least.");
  for (int r = 0; r < world_size_; ++r) {
    barrier_wait_.push_back(
        &barrier.Add({{"rank", absl::StrCat(r)}}, SecondsBuckets()));
  }
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
  if (p.has_eval) {
    test_accuracy_->Add({}).Set(p.test_accuracy);
    test_loss_->Add({}).Set(p.test_loss);
  }
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
