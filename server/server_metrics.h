// What dp-ps exports to Prometheus: training progress, workers, rejections,
// update and barrier times, elasticity, checkpoints (docs/monitoring.md).
#ifndef DP_SERVER_SERVER_METRICS_H_
#define DP_SERVER_SERVER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace dp {

struct CoordinatorStatus;  // server/step_coordinator.h

class ServerMetrics final : public Metrics {
 public:
  // world_size fixes the rank labels (0..world_size-1); min_workers is the
  // job's --min_workers (0 counts as 1). Every series carries
  // shard="<shard>" (0 for a dp-ps of one shard), so that the shards of one
  // job, scraped under one job name, stay apart. A rank counts as active
  // while it made a request within `active_window`: a worker waiting at the
  // barrier re-asks every --wait_timeout_s (30 s by default), so the window
  // must be longer than that.
  explicit ServerMetrics(int world_size, int shard = 0, int min_workers = 1,
                         absl::Duration active_window = absl::Seconds(60),
                         std::function<absl::Time()> now = absl::Now);

  // A request naming `rank` arrived. Ranks outside 0..world_size-1 are
  // ignored: a bad request must not create a series.
  void SawRank(int rank);
  // A request finished with `code`. OK and CANCELLED (the client gave up,
  // e.g. its barrier deadline passed) are not rejections.
  void CountRejected(absl::StatusCode code);
  // From a rank's arrival at the barrier (its push, for PushPull) to the
  // update that released it. The slowest rank waits least.
  void ObserveBarrierWait(int rank, absl::Duration wait);
  // Averaging the N gradients plus the Adam step.
  void ObserveUpdate(absl::Duration apply);

  // State kept by the coordinator, mirrored at scrape time.
  struct Progress {
    int64_t step = 0;           // updates applied
    int64_t planned_steps = 0;  // 0 until the data set size is known
    int epoch = 0;              // 1-based epoch of the next step; 0 unknown
    bool has_loss = false;
    double loss = 0.0;  // mean of the ranks' losses of the last step
    bool has_eval = false;
    double test_accuracy = 0.0;
    double test_loss = 0.0;
    int registered_workers = 0;
    bool failed = false;  // the job failed (StepCoordinator::Fail)
  };
  void SetProgress(const Progress& p);

  // The checkpoint store, mirrored at scrape time. A dp-ps without
  // --checkpoint_dir exports the zeros (no checkpoint, none due, no
  // failure), so that the rules read the same series on every dp-ps.
  // write_failures is cumulative, as the store counts it: the counter grows
  // by the difference to the last call (never down).
  struct Checkpoints {
    int64_t interval_steps = 0;  // --checkpoint_every; 0: at the end only
    int64_t newest_step = 0;     // the newest on disk; 0: none
    int64_t write_failures = 0;
  };
  void SetCheckpoints(const Checkpoints& c);

  // How the step coordinator spreads the work (see ElasticityOf), mirrored
  // at scrape time. The counts are cumulative, as the coordinator keeps
  // them: their counters grow by the difference to the last call (never
  // down). Per-rank entries beyond world_size are ignored; a rank missing
  // from planned_micro_batches reads 0, one missing from
  // steps_completed_by keeps its count.
  struct Elasticity {
    int live_workers = 0;                    // registered and not lost
    int micro_batches = 0;                   // per step
    std::vector<int> planned_micro_batches;  // by rank, in the current plan
    int64_t blocks_reassigned = 0;
    int64_t backup_blocks = 0;
    int64_t duplicate_pushes = 0;
    std::vector<int64_t> steps_completed_by;  // by rank
  };
  void SetElasticity(const Elasticity& e);

  // Ranks seen within the active window, now.
  int ActiveWorkers() const;

 private:
  // The metric families, in groups, in the order /metrics lists them.
  void AddProgressMetrics();
  void AddWorkerMetrics(int min_workers);
  void AddFailureMetrics();
  void AddStepMetrics();
  void AddElasticityMetrics();
  void AddRejectionMetrics();
  void AddEvaluationMetrics();
  void BeforeScrape() override;

  const int world_size_;
  const absl::Duration active_window_;
  const std::function<absl::Time()> now_;
  // Unix nanoseconds of each rank's latest request; INT64_MIN = never.
  std::unique_ptr<std::atomic<int64_t>[]> last_seen_;
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Gauge* step_;
  prometheus::Gauge* planned_steps_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* expected_workers_;
  prometheus::Gauge* min_workers_;
  prometheus::Gauge* registered_workers_;
  prometheus::Gauge* active_workers_;
  prometheus::Gauge* failed_;
  prometheus::Gauge* checkpoint_interval_;
  prometheus::Gauge* checkpoint_step_;
  prometheus::Counter* checkpoint_failures_;
  absl::Mutex checkpoint_mu_;
  int64_t mirrored_failures_ ABSL_GUARDED_BY(checkpoint_mu_) = 0;
  prometheus::Histogram* update_seconds_;
  std::vector<prometheus::Histogram*> barrier_wait_;  // by rank
  prometheus::Gauge* live_workers_;
  prometheus::Gauge* micro_batches_;
  std::vector<prometheus::Gauge*> planned_micro_batches_;  // by rank
  prometheus::Counter* blocks_reassigned_;
  prometheus::Counter* backup_blocks_;
  prometheus::Counter* duplicate_pushes_;
  std::vector<prometheus::Counter*> steps_completed_by_;  // by rank
  // The cumulative counts the counters above were last brought up to:
  // concurrent scrapes must not add the same difference twice.
  absl::Mutex elastic_mu_;
  Elasticity mirrored_ ABSL_GUARDED_BY(elastic_mu_);
  // By absl::StatusCode value, all created at 0 so that rate() works from
  // the first scrape; the label set is the fixed list of code names.
  std::vector<prometheus::Counter*> rejected_;
  // Their series appear with the first evaluation: a 0 before that would
  // read as "0% accuracy".
  prometheus::Family<prometheus::Gauge>* test_accuracy_;
  prometheus::Family<prometheus::Gauge>* test_loss_;
};

// The elasticity part of the coordinator's status, for SetElasticity.
ServerMetrics::Elasticity ElasticityOf(const CoordinatorStatus& s);

}  // namespace dp

#endif  // DP_SERVER_SERVER_METRICS_H_
