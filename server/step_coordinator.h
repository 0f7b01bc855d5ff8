// The parameter store and the synchronous step protocol of dp-ps: collects
// the N pushes of step t, averages them in rank order, applies one Adam
// update and publishes version t+1. No gRPC types here; ps_service.cc maps
// requests onto these calls.
//
// Every method validates its request completely before touching state, so a
// rejected request changes nothing. Status codes follow docs/protocol.md:
// INVALID_ARGUMENT (sizes, non-finite values, rank), FAILED_PRECONDITION
// (fingerprints, not registered), ABORTED (stale or future step),
// UNAVAILABLE (shutting down).
#ifndef DP_SERVER_STEP_COORDINATOR_H_
#define DP_SERVER_STEP_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/data_order.h"
#include "common/dataset.h"
#include "common/job_config.h"
#include "common/lent_buffer.h"
#include "common/model_layout.h"
#include "common/parallel_for.h"
#include "common/shard_plan.h"
#include "server/adam.h"

namespace dp {

struct CoordinatorStatus {
  JobConfig config;
  ShardSpec shard;
  uint64_t generation = 0;
  bool holds_previous = false;
  int64_t step = 0;
  int64_t total_steps = 0;  // 0 until the data set size is known
  std::vector<int> registered_ranks;
  std::vector<int> pushed_ranks;
  bool done = false;
  float last_loss = 0.0f;  // mean of the ranks' losses of the last step
  bool has_eval = false;
  EvalReport last_eval;
  // When the first and the latest update of this process were applied:
  // the training rate without start-up and data loading.
  int64_t first_applied_step = 0;
  absl::Time first_apply = absl::InfinitePast();
  absl::Time last_apply = absl::InfinitePast();
  // Where a step's time goes on the server: the update itself, and per rank
  // the time from its push to the published update (waiting for the others).
  int64_t applies = 0;
  absl::Duration apply_time;
  // Reading the pushes' gradients (checked and summed as read; every push,
  // all ranks) and what WithCurrentWeights' callers did with the weights
  // (publishing them into shared memory).
  absl::Duration read_time;
  absl::Duration use_time;
  std::vector<absl::Duration> wait_time;
  // How many times Pull encoded the weights into a snapshot: at most once a
  // version, and never for one that only WithCurrentWeights handed out.
  int64_t snapshots = 0;
};

class StepCoordinator {
 public:
  // update_threads: how many threads run the average + Adam update (the
  // result is bit-identical for any number). `shard` says which range of
  // the vector this coordinator owns (count 1: all of it); `state` holds
  // that range.
  StepCoordinator(ModelLayout layout, JobConfig config, TrainingState state,
                  int update_threads = 1, ShardSpec shard = {});

  const ModelLayout& layout() const { return layout_; }
  const ShardSpec& shard() const { return shard_; }

  struct Registration {
    JobConfig config;
    int64_t step = 0;
  };
  // Admits `rank` (again, after a restart). The first registration fixes the
  // data fingerprint of the job; later ones must match it.
  absl::StatusOr<Registration> Register(int rank, uint64_t model_fingerprint,
                                        const DataFingerprint& data);

  // The weights of one version, encoded in the job's weight_encoding in an
  // immutable snapshot that every caller shares until the next update:
  // serving N workers encodes the weights once per step, and gRPC sends
  // them from the snapshot without copying.
  struct PulledWeights {
    int64_t step = 0;  // their version
    Encoding encoding = Encoding::kF32;
    // A lease on the snapshot (common/lent_buffer.h): keeps it alive and
    // unwritten while held.
    std::shared_ptr<const void> lease;
    absl::string_view snapshot;  // all of it
    absl::string_view bytes;     // params[offset, offset + length), encoded
  };
  // params[offset, offset+length) of the current version (or of `version`,
  // when it is the one before and a sharded coordinator still holds it);
  // offsets are into the whole vector and must lie in this shard's range;
  // length 0 means "to the end of the range".
  absl::StatusOr<PulledWeights> Pull(
      int rank, int64_t offset, int64_t length,
      std::optional<int64_t> version = std::nullopt);

  // Calls use(step, params) with this shard's float32 params of the current
  // version, under the coordinator's lock: they cannot change meanwhile,
  // and nothing else can happen either, so `use` must be quick and must not
  // call the coordinator. For copying them somewhere straight from the
  // params, without Pull's snapshot (shared memory, when the weights travel
  // as float32). Checks `rank` and renews its lease as Pull does; returns
  // the version.
  absl::StatusOr<int64_t> WithCurrentWeights(
      int rank,
      absl::FunctionRef<void(int64_t step, absl::Span<const float> params)>
          use);

  struct PushResult {
    int64_t step = 0;        // the job's step after this push
    bool duplicate = false;  // retry of an already received or applied push
  };
  // Receives the gradient (this shard's whole range, at its offset, in the
  // job's grad_encoding) of `rank` for `step`. The last of the N pushes applies
  // the update. A retry for the current step or the one just applied is
  // acknowledged and not counted twice.
  absl::StatusOr<PushResult> Push(int rank, int64_t step, int64_t offset,
                                  absl::string_view gradient, float loss,
                                  Encoding encoding = Encoding::kF32);

  using WaitCallback = std::function<void(const absl::Status&, int64_t step)>;
  struct WaitTicket {
    bool ready = false;  // `step` is already applied; `done` is dropped
    int64_t step = 0;    // the job's step when ready
    int64_t id = 0;      // for CancelWait when !ready
  };
  // How many waits one rank may have pending. A worker has one (two for a
  // moment when it retries after a deadline, before the cancellation of the
  // old call arrives); the bound keeps a misbehaving client from piling up
  // waits. A wait beyond it evicts that rank's oldest wait, which fails with
  // ABORTED, so the newest call of a well-behaved worker always waits.
  static constexpr int kMaxWaitsPerRank = 4;

  // Waits for `step` to be applied. Invalid requests fail at once. When the
  // step is already applied the ticket is ready and `done` is never called.
  // Otherwise done(status, new_step) is called exactly once, from the thread
  // that applies the step, with UNAVAILABLE at Shutdown(), or with ABORTED
  // when a newer wait of the same rank evicts it (kMaxWaitsPerRank), unless
  // CancelWait(ticket.id) returns true first.
  absl::StatusOr<WaitTicket> WaitForStep(int rank, int64_t step,
                                         WaitCallback done);
  // True when the wait was removed before its callback ran: the callback will
  // then never run. False when it ran or is running.
  bool CancelWait(int64_t id);

  // INVALID_ARGUMENT for a bad rank or values that are not finite or not in
  // [0, 1], ABORTED for the weights of a future step; nothing is recorded
  // then.
  absl::Status RecordEval(int rank, const EvalReport& report);
  // Every step is applied.
  bool done() const;

  // Blocks until every step is applied, or `timeout` passes, or the job
  // fails or shuts down; true only if every step is applied.
  bool AwaitDone(absl::Duration timeout) const;
  // Blocks until the final evaluation is reported or `timeout` passes.
  bool AwaitFinalEval(absl::Duration timeout) const;
  // Rejects further requests with UNAVAILABLE and fails pending waits.
  void Shutdown();
  // Ends the job with `reason`, a JobFailedError (common/grpc_status.h):
  // pending waits and every later request get it.
  void Fail(const absl::Status& reason);

  // Sets the state back to `state` (an earlier step's, of this shard) when
  // the coordinator is still at `generation`: pending waits fail with
  // ABORTED, received pushes are dropped, and the generation is new.
  // ABORTED, changing nothing, when the generation moved on (a rollback
  // decided on what is no longer so). A state at the current step changes
  // nothing.
  absl::Status Rewind(uint64_t generation, TrainingState state);

  // Restores the data fingerprint saved with a checkpoint, as if the worker
  // that defined it had registered. INVALID_ARGUMENT if the schedule cannot
  // run on it.
  absl::Status RestoreData(const DataFingerprint& data);
  std::optional<DataFingerprint> data() const;

  // Calls hook(state, generation) with a consistent copy of the state after
  // every `every`-th step, outside the lock, in the thread that applied the
  // step; `generation` was the coordinator's when the copy was taken (a
  // Rewind may come before the hook runs: see CheckpointStore::Rewind).
  void SetCheckpointHook(int64_t every,
                         std::function<void(TrainingState, uint64_t)> hook);

  // Lease events since the last call. A rank the current step still needs
  // is "missing" once it has made no call for `timeout` while not waiting in
  // a call; "back" when it calls again. Ranks that never registered are
  // reported as "not registered yet".
  struct LeaseEvent {
    int rank;
    enum Kind { kMissing, kBack, kNeverRegistered } kind;
    absl::Duration silent;  // how long it has been (kBack: was) silent
  };
  std::vector<LeaseEvent> CheckLeases(absl::Duration timeout);

  // Called with the time the average + Adam took, after every update, under
  // the coordinator's lock: it must be quick and must not call back. For
  // metrics; set it before serving.
  void SetUpdateObserver(std::function<void(absl::Duration)> observer);

  TrainingState Snapshot() const;
  CoordinatorStatus Status() const;

  // Everything a request can change, leases and waiters included: what
  // "a rejected request changes nothing" is checked against.
  struct ObservableState {
    TrainingState training;
    JobConfig config;
    std::optional<DataFingerprint> data;
    std::vector<bool> registered;
    std::vector<bool> received;
    std::vector<float> losses;                  // of received ranks, else 0
    std::vector<std::vector<float>> gradients;  // of received, unfolded ranks
    int folded = 0;                     // ranks [0, folded) are in rank_sum
    std::vector<float> rank_sum;        // when folded > 0
    std::vector<absl::Time> last_seen;  // the leases
    std::vector<std::pair<int, int64_t>> waiters;  // (rank, step), oldest first
    bool has_eval = false;
    bool final_eval = false;
    EvalReport last_eval;
    bool shutdown = false;
    absl::Status failed;
  };
  ObservableState Observe() const;

 private:
  struct Waiter {
    int rank;
    int64_t step;
    WaitCallback done;
  };
  absl::StatusOr<WaitTicket> WaitForStepLocked(int rank, int64_t step,
                                               WaitCallback done,
                                               WaitCallback* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that `rank` is alive. Only an accepted call renews the lease: a
  // rank whose every request is refused is not taking part, and must be
  // reported missing.
  void Touch(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRank(const char* rpc, int rank) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The steps of Push. Checks the gradient's encoding, shape and values,
  // reading them once into private memory - for the next rank to fold, into
  // the sum that includes them (next_sum_).
  absl::Status ReadGradientLocked(int rank, int64_t step, int64_t offset,
                                  absl::string_view gradient, Encoding encoding)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rank` has not pushed this step and every rank before it has: its
  // gradient is added to the sum as it is read, with the kept gradients of
  // the ranks after it that are in.
  bool IsNextToFoldLocked(int rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // True for a retry of a push already received or applied; an error for a
  // push the step refuses (not registered, stale, future, after the end).
  absl::StatusOr<bool> IsRetryLocked(int rank, int64_t step) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What an accepted push leaves to do once the lock is released.
  struct AfterPush {
    std::vector<WaitCallback> to_notify;  // the step was applied
    std::function<void(TrainingState, uint64_t)> checkpoint_hook;
    uint64_t generation = 0;  // of the checkpoint's state
    TrainingState checkpoint;
  };
  // Counts the push in (when the rank was next to fold, the sum
  // ReadGradientLocked made becomes the sum); the last of the N applies the
  // update.
  AfterPush AcceptPushLocked(int rank, float loss)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error every request gets once the job failed or is shutting down.
  absl::Status RefusalLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Averages the pushes, applies Adam, publishes the next version; returns
  // the waiters to call once the lock is released.
  std::vector<WaitCallback> ApplyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes every waiter, returning their callbacks.
  std::vector<WaitCallback> TakeAllWaitersLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t TotalStepsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const ModelLayout layout_;
  const ShardSpec shard_;
  const int64_t n_;  // values of the range this coordinator owns
  mutable absl::Mutex mu_;
  WorkerPool pool_ ABSL_GUARDED_BY(mu_);  // runs the update, under mu_
  JobConfig config_ ABSL_GUARDED_BY(mu_);
  TrainingState state_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_);
  // Sharded: the params of version state_.step - 1, for a worker that joins
  // while another shard still waits for its push of that step.
  std::vector<float> previous_ ABSL_GUARDED_BY(mu_);
  bool holds_previous_ ABSL_GUARDED_BY(mu_) = false;
  bool have_data_ ABSL_GUARDED_BY(mu_) = false;
  DataFingerprint data_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> registered_ ABSL_GUARDED_BY(mu_);
  // Gradients of the current step that came before the ranks they follow,
  // kept until the next rank to fold adds them: one preallocated buffer per
  // rank (rank 0 never comes early: none).
  std::vector<std::vector<float>> gradients_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> received_ ABSL_GUARDED_BY(mu_);
  // The sum of the gradients of ranks [0, folded_) of this step, added in
  // rank order as they arrive (AddEncodedToRankSum as the next rank's is
  // read, with those of the ranks after it that came before it): a rank
  // waits for the ranks before it, not for the last, and at the last push
  // only its own gradient and the update remain.
  std::vector<float> rank_sum_ ABSL_GUARDED_BY(mu_);
  // rank_sum_ plus the gradient being read of the next rank to fold (and
  // the kept ones after it); it becomes rank_sum_ only if the push is
  // accepted.
  std::vector<float> next_sum_ ABSL_GUARDED_BY(mu_);
  int folded_ ABSL_GUARDED_BY(mu_) = 0;
  // Where a retry's gradient is read to be checked (received_[rank] holds
  // the first).
  std::vector<float> retry_scratch_ ABSL_GUARDED_BY(mu_);
  std::vector<float> losses_ ABSL_GUARDED_BY(mu_);
  // The snapshot Pull hands out for the current version (null until the
  // first pull after an update), and the buffers snapshots are made in: one
  // still referenced by a response in flight is never overwritten.
  LentBuffer* published_ ABSL_GUARDED_BY(mu_) = nullptr;
  LentBufferPool snapshots_ ABSL_GUARDED_BY(mu_);
  int64_t snapshots_made_ ABSL_GUARDED_BY(mu_) = 0;
  float last_loss_ ABSL_GUARDED_BY(mu_) = 0.0f;
  int64_t first_applied_step_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time first_apply_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_apply_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t applies_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration apply_time_ ABSL_GUARDED_BY(mu_);
  absl::Duration read_time_ ABSL_GUARDED_BY(mu_);
  absl::Duration use_time_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> arrival_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> wait_time_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);  // by id = age
  std::vector<int> waits_of_rank_ ABSL_GUARDED_BY(mu_);
  int64_t next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool has_eval_ ABSL_GUARDED_BY(mu_) = false;
  bool final_eval_ ABSL_GUARDED_BY(mu_) = false;
  EvalReport last_eval_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  int64_t checkpoint_every_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(TrainingState, uint64_t)> checkpoint_hook_
      ABSL_GUARDED_BY(mu_);
  const absl::Time started_;
  std::vector<absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> reported_missing_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> missing_since_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> reported_unregistered_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Duration)> update_observer_ ABSL_GUARDED_BY(mu_);
};

// The names of the fields of `a` and `b` that differ, comma-separated;
// empty when they are the same (floats compared bit by bit).
std::string ObservableDifferences(const StepCoordinator::ObservableState& a,
                                  const StepCoordinator::ObservableState& b);

}  // namespace dp

#endif  // DP_SERVER_STEP_COORDINATOR_H_
