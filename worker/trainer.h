// The worker loop: learn the job from dp-ps, load the data it names, join,
// then per step: the blocks of micro-batches dp-ps hands this worker (each
// micro-batch's gradient alone, the block summed in the step's tree) ->
// exchange (push, barrier, new weights or more work). Rank 0 also evaluates
// the test set at the end of every epoch.
// Every (re-)join adopts the job's plan as dp-ps has it then, so a dp-ps
// restarted with more or fewer steps is followed.
#ifndef DP_WORKER_TRAINER_H_
#define DP_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data_order.h"
#include "common/dataset.h"
#include "common/lent_buffer.h"
#include "worker/backend.h"
#include "worker/backend_choice.h"
#include "worker/ps_group.h"
#include "worker/worker_metrics.h"

namespace dp {

struct TrainerOptions {
  // kAnyRank: dp-ps picks one when the worker joins.
  static constexpr int kAnyRank = -1;
  int rank = 0;
  std::string data_dir;   // empty: the data set's default location
  BackendChoice backend;  // default: the CPU backend
  int cpu_threads = 1;
  bool tf32 = false;  // CUDA: TF32 tensor-core matrix products
  bool fused = true;  // PushPull instead of Push + Barrier + Pull
  // Read before every step: once true, Run returns CANCELLED, so a worker
  // asked to stop (SIGTERM) does so after the step in progress.
  const std::atomic<bool>* stop = nullptr;
  // Called once the worker has joined the job (data loaded, backend up,
  // registered, weights pulled): its readiness.
  std::function<void()> on_joined;
  WorkerMetrics* metrics = nullptr;  // not owned; null: an unexported one
};

struct TrainerStats {
  int64_t steps = 0;            // steps completed by this process
  int64_t gradients = 0;        // forward+backward passes (micro-batches)
  int64_t extra_blocks = 0;     // blocks dp-ps handed over mid-step
  int64_t resyncs = 0;          // re-joins: dp-ps no longer knew this rank
  int64_t catch_ups = 0;        // moves to the newest version after ABORTED
  int64_t wait_timeouts = 0;    // barrier waits past --wait_timeout_s
  double compute_seconds = 0;   // forward + backward
  double exchange_seconds = 0;  // push, barrier wait, pull
  double cpu_seconds = 0;       // of the process, from the join to the end
  int64_t bytes_sent = 0;       // message payloads of the exchange
  int64_t bytes_received = 0;
};

class Trainer {
 public:
  Trainer(PsGroup* client, TrainerOptions options);
  ~Trainer();

  // OK when every step of the job is applied. FAILED_PRECONDITION and
  // INVALID_ARGUMENT mean a configuration problem (data, rank, fingerprint);
  // CANCELLED that options.stop was set.
  absl::Status Run();
  const TrainerStats& stats() const { return stats_; }

 private:
  // The job's data set (and rank 0's test set) and the backend: once.
  absl::Status Load();
  // (Re-)joins: registers and pulls the weights of the step registered at,
  // again while the shards moved apart in between.
  absl::Status Join();
  // Registers and adopts the job's plan and step as dp-ps has them now.
  absl::Status Register();
  // Pulls the weights of the step the job is at now, and adopts them.
  absl::Status PullNewest();
  // Hands weights_ to the backend: viewed where they lie when some are read
  // in place in shared memory (that memory holds them until the next
  // exchange), else taken from the buffer they were received in.
  absl::Status AdoptWeights();
  // Forward+backward of each micro-batch of `block` at step_, alone, summed
  // in the tree's order (common/micro_batch_tree.h) and encoded for the
  // wire.
  absl::StatusOr<Gradient> Compute(const Block& block);
  // Sends the gradient (or, idle, nothing) and returns with the next
  // weights in weights_, or with more work for step_ (weights_.work_only).
  // A barrier wait that outlasts its deadline is reported and waited again
  // with the same bytes: a block is never computed twice.
  absl::Status Exchange(const Gradient& gradient);
  // Computes and exchanges the blocks of step_ dp-ps hands this rank (its
  // own, then any handed to it while the step runs) until the step is
  // applied: weights_ then holds the next version. *exchanged is the last
  // exchange's outcome, *computed when the last computation ended; an
  // error is returned only when a computation itself fails.
  absl::Status Step(absl::Time* computed, absl::Status* exchanged);
  // After Step: the job moved on without this rank (a stale or future step,
  // an unexpected version) or dp-ps no longer knows it.
  bool NeedsResync(const absl::Status& exchanged) const;
  // Back in step with the job after `why` (NeedsResync): the newest
  // version, the registration standing; a join again when dp-ps no longer
  // knows this rank (FAILED_PRECONDITION) or that pull fails.
  absl::Status Resync(const absl::Status& why);
  // The end line: steps, gradients, time and bytes per step.
  void LogSummary() const;
  // Rank 0: loads the test set into test_ and checks it against the
  // training set and `layout` (an absent npy test set: no samples).
  absl::Status LoadTestSet(const ModelLayout& layout);
  // Rank 0: the test set on the weights after `finished`, reported to dp-ps
  // (with no test set: only the end, with no samples).
  absl::Status Evaluate(int64_t finished);
  // Whom step_ waits for, from every shard's status ("?" when they cannot
  // say).
  std::string MissingRanks();

  PsGroup* const client_;
  const TrainerOptions options_;
  int rank_;  // as of the last join (options_.rank, or the one picked)
  std::unique_ptr<WorkerMetrics> unexported_;
  WorkerMetrics& metrics_;
  TrainerStats stats_;

  // Loaded once.
  JobConfig loaded_;  // the plan the data and buffers were made for
  Dataset train_;
  std::optional<Dataset> test_;
  std::unique_ptr<Backend> backend_;
  RegistrationRequest registration_;

  // As of the last join.
  Schedule schedule_;
  std::unique_ptr<BatchSampler> sampler_;
  int64_t total_ = 0;  // steps of the job

  int64_t step_ = 0;  // the version of weights_, the step computed next
  Weights weights_;
  std::vector<float> x_;    // (batch, input_dim)
  std::vector<int32_t> y_;  // (batch)
  // The gradient on the wire: a buffer gRPC still sends from is never
  // written; the backend writes float32 straight into it.
  std::unique_ptr<LentBufferPool> wire_;
  std::vector<float> grad_;  // float32 gradient for the other encodings
  // A block's micro-batch gradients before they are summed.
  std::vector<std::vector<float>> leaves_;
  size_t grad_size_ = 0;  // values of a gradient
  // As of the last join: the path the log and the metric last named (shared
  // memory or gRPC), and whether the backend computes the gradient straight
  // into the one dp-ps's shared-memory slot.
  bool logged_shared_memory_ = false;
  // Rank 0 reported its evaluation of the job's final weights.
  bool evaluated_final_ = false;
  bool gradient_into_slot_ = false;
};

}  // namespace dp

#endif  // DP_WORKER_TRAINER_H_
