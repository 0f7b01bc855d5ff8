// The parameter store and the synchronous step protocol of dp-ps: hands
// the blocks of step t's micro-batch tree (common/micro_batch_tree.h) to the
// ranks that are live, collects their sums, adds them in tree order,
// applies one Adam update and publishes version t+1. A lost rank's block
// goes to the others, a late one is computed by an idle rank as well
// (the first copy counts: they are equal bit for bit), a rank that joins
// gets blocks from the next step on: the result depends only on the
// micro-batches, never on who computed them. No gRPC types here;
// ps_service.cc maps requests onto these calls.
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
#include <thread>
#include <utility>
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
#include "common/micro_batch_tree.h"
#include "common/model_layout.h"
#include "common/parallel_for.h"
#include "common/shard_plan.h"
#include "server/adam.h"
#include "server/block_planner.h"
#include "server/coordinator_status.h"
#include "server/due_watcher.h"
#include "server/eval_record.h"
#include "server/job_data.h"
#include "server/rank_roster.h"
#include "server/step_stats.h"
#include "server/straggler_backups.h"
#include "server/sum_tree.h"
#include "server/wait_queue.h"
#include "server/weights_publisher.h"

namespace dp {

struct CoordinatorMirror;

class StepCoordinator {
 public:
  // update_threads: how many threads run the average + Adam update (the
  // result is bit-identical for any number). `shard` says which range of
  // the vector this coordinator owns (count 1: all of it); `state` holds
  // that range.
  StepCoordinator(ModelLayout layout, JobConfig config, TrainingState state,
                  int update_threads = 1, ShardSpec shard = {});

  ~StepCoordinator();

  const ModelLayout& layout() const { return layout_; }
  const ShardSpec& shard() const { return shard_; }

  // Before serving. A leader with backup_blocks > 0 starts a thread that
  // hands late blocks to idle ranks; it ends at Shutdown or destruction.
  // The current step starts now, by the options' clock.
  void SetElastic(const ElasticOptions& options);

  // Hands late blocks to idle waits while one is due by the options' clock
  // (at most backup_blocks a step), as the straggler thread does whenever
  // it wakes; returns when the next one falls due (InfiniteFuture: none
  // pending). A test whose clock it advances itself calls this after each
  // advance: the thread, waiting in real time, may or may not have.
  absl::Time BackUpLateBlocks();

  struct Registration {
    JobConfig config;
    int64_t step = 0;
    int rank = 0;          // the rank admitted (kAnyRank: the one picked)
    uint64_t session = 0;  // names this registration (Attend)
  };
  // Register's rank when dp-ps picks it: the one last registered with this
  // worker_id (the same process joining again), else `preferred` if it is
  // free (the rank the process had before this dp-ps restarted), else the
  // lowest never registered, else the lowest whose process is lost.
  static constexpr int kAnyRank = -1;
  // Admits `rank` (again, after a restart). The first registration fixes the
  // data fingerprint of the job; later ones must match it.
  // RESOURCE_EXHAUSTED for kAnyRank when every rank is live.
  //
  // A rank is held by the process that registered it (its worker_id) for as
  // long as that process is live: its connection open (ConnectionClosed not
  // called) and its lease not run out (ElasticOptions::lease, as
  // CheckLeases counts it). Another process's registration of a held rank
  // is refused with RESOURCE_EXHAUSTED naming the holder, changing nothing
  // (a second process of the rank stands by, and asks again); the holder
  // registering again is admitted, and so is anyone once every step is
  // applied. A restarted dp-ps holds no rank: the first to register gets
  // it.
  absl::StatusOr<Registration> Register(int rank, uint64_t model_fingerprint,
                                        const DataFingerprint& data,
                                        absl::string_view worker_id = {},
                                        int preferred = -1);

  // A registered worker keeps a call open for as long as it is there
  // (PsService's Attend), naming its registration's session: OK while that
  // is the rank's current registration, FAILED_PRECONDITION once the rank
  // registered again.
  absl::Status Attend(int rank, uint64_t session);
  // That call ended: the worker's connection closed (its process is gone)
  // or it cancelled the call (it stopped). The rank is missing at once, as
  // if its lease had run out: with reassign its block goes to the others
  // now, CheckLeases reports it (closed), and another process may register
  // it. Nothing happens when the rank registered again since; once the job
  // is over, or dp-ps shuts down, only the rank is free.
  void ConnectionClosed(int rank, uint64_t session);

  // The weights of one version, encoded in the job's weight_encoding in an
  // immutable snapshot that every caller shares until the next update:
  // serving N workers encodes the weights once per step, and gRPC sends
  // them from the snapshot without copying.
  struct PulledWeights {
    int64_t step = 0;  // their version
    Block block;       // what the rank computes from them (NextWork)
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
  // the version and the rank's block, as Pull does.
  struct Version {
    int64_t step = 0;
    Block block;
  };
  // With `version` set, ABORTED (calling nothing) unless it is the
  // current one.
  absl::StatusOr<Version> WithCurrentWeights(
      int rank,
      absl::FunctionRef<void(int64_t step, absl::Span<const float> params)> use,
      std::optional<int64_t> version = std::nullopt);

  struct PushResult {
    int64_t step = 0;        // the job's step after this push
    bool duplicate = false;  // retry of an already received or applied push
  };
  // Receives the sum (this shard's whole range, at its offset, in the job's
  // grad_encoding) of `block` of `step` from `rank`; an empty block is
  // micro-batch `rank` (one per worker). `loss` is the mean over the
  // block's samples. Any rank may push any node of the tree: the first copy
  // of a block counts, a later one (or one inside a block that is in) is
  // acknowledged as a duplicate, as is a retry of the step just applied.
  // The push that completes the tree applies the update.
  absl::StatusOr<PushResult> Push(int rank, int64_t step, int64_t offset,
                                  absl::string_view gradient, float loss,
                                  Encoding encoding = Encoding::kF32,
                                  Block block = Block{});

  // done(status, step, work): `work` non-empty means the step is not applied
  // and the rank is to compute that block of it (step is then the current
  // one); otherwise `step` was applied and the job is at `step`.
  using WaitCallback = WaitQueue::Callback;
  struct WaitTicket {
    bool ready = false;  // `step` is already applied, or `work` is given:
                         // `done` is dropped
    int64_t step = 0;    // the job's step when ready
    int64_t id = 0;      // for CancelWait when !ready
    Block work;          // ready with a block to compute at the current step
  };
  // How many waits one rank may have pending. A worker has one (two for a
  // moment when it retries after a deadline, before the cancellation of the
  // old call arrives); the bound keeps a misbehaving client from piling up
  // waits. A wait beyond it evicts that rank's oldest wait, which fails with
  // ABORTED, so the newest call of a well-behaved worker always waits.
  static constexpr int kMaxWaitsPerRank = 4;

  // Waits for `step` to be applied, or for work at it. Invalid requests fail
  // at once. When the step is already applied, or the rank has a block to
  // compute (its own not pushed yet, a lost rank's), the ticket is ready and
  // `done` is never called. Otherwise done(status, new_step, work) is called
  // exactly once, from the thread that applies the step or hands the rank
  // work, with UNAVAILABLE at Shutdown(), or with ABORTED when a newer wait
  // of the same rank evicts it (kMaxWaitsPerRank), unless
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
  // Ends the job with `reason`, a JobFailedError (common/job_failure.h):
  // pending waits and every later request get it.
  void Fail(const absl::Status& reason);
  // After Fail: blocks until every live rank has been told (a wait ended or
  // a call refused with the failure) or `timeout` passes; true if all were.
  // A worker may be computing when the job fails: serving the failure a
  // little longer tells it, where a closed port would have it retry.
  bool AwaitFailureTold(absl::Duration timeout) const;
  // After the end: blocks until no attending process holds a rank any more
  // (each one's connection closed, or its lease ran out while it waited in
  // no call) or `timeout` passes; the ranks still held (see
  // RankRoster::AttendingRanks). A worker late with its last
  // block still calls every shard before it exits: serving it a little
  // longer spares it a closed port that it would retry.
  std::vector<int> AwaitRanksGone(absl::Duration timeout) const;

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
  // every `every`-th step (every > 0), outside the lock, in the thread that
  // applied the step; `generation` was the coordinator's when the copy was
  // taken (a Rewind may come before the hook runs: see
  // CheckpointStore::Rewind). Hooks due at one step run in the order added.
  using StepHook = std::function<void(TrainingState, uint64_t)>;
  void AddStepHook(int64_t every, StepHook hook);

  // Lease events since the last call. A registered rank is "missing" once
  // it has made no call for `timeout` while not waiting in a call, or once
  // its connection closed (ConnectionClosed); "back"
  // when it calls again. Ranks that never registered are reported as "not
  // registered yet". A missing rank is lost: with reassign, its block goes
  // to an idle rank at once, or to the next that asks. Only the leader
  // reports. Also starts the first step once the start wait is over.
  using LeaseEvent = ::dp::LeaseEvent;
  std::vector<LeaseEvent> CheckLeases(absl::Duration timeout);

  // Called with the time the average + Adam took, after every update, under
  // the coordinator's lock: it must be quick and must not call back. For
  // metrics; set it before serving.
  void SetUpdateObserver(std::function<void(absl::Duration)> observer);
  // Where each update also writes the weights it makes, in its own pass:
  // the sink is called with the version the update makes and must call
  // `update` once, with where the weights go (the shared plane's buffer of
  // that version, in the job's weight encoding) or no copy. Under the
  // coordinator's lock: it must not call back. Set it before serving.
  using UpdateSink = std::function<void(
      int64_t step, absl::FunctionRef<void(EncodedCopy)> update)>;
  void SetUpdateSink(UpdateSink sink);

  TrainingState Snapshot() const;
  CoordinatorStatus Status() const;

  // For tests (server/coordinator_mirror.h): a copy of everything a
  // request can change.
  using ObservableState = CoordinatorMirror;
  ObservableState Observe() const;

 private:
  // A wait to finish once the lock is released.
  using Wake = WaitQueue::Wake;
  absl::StatusOr<Registration> RegisterLocked(int rank,
                                              uint64_t model_fingerprint,
                                              const DataFingerprint& data,
                                              absl::string_view worker_id,
                                              int preferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WaitTicket> WaitForStepLocked(int rank, int64_t step,
                                               WaitCallback done,
                                               std::vector<Wake>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRank(const char* rpc, int rank) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int K() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return config_.schedule.num_micro_batches();
  }
  // The steps of Push. Checks the gradient's encoding, shape and values,
  // reading them once into private memory: for a push that can count, into
  // the tree's spare buffer, folded as read with the sums that are in
  // (SumTree::Read, *folding says where it goes); otherwise only checked.
  absl::Status ReadGradientLocked(int rank, int64_t step, int64_t offset,
                                  absl::string_view gradient, Encoding encoding,
                                  const Block& block, bool counts,
                                  SumTree::Folding* folding)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True for a push that does not count (a retry of the step just applied,
  // a block already in); an error for a push the step refuses (not
  // registered, stale, future, after the end). `block` is a node.
  absl::StatusOr<bool> IsDuplicateLocked(int rank, int64_t step,
                                         const Block& block) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // What an accepted push leaves to do once the lock is released.
  struct AfterPush {
    std::vector<Wake> wakes;      // the step was applied
    std::vector<StepHook> hooks;  // due at this step
    uint64_t generation = 0;      // of the state's copy
    TrainingState state;          // taken for the hooks
  };
  // Makes the sum ReadGradientLocked read the tree's (SumTree::Accept); the
  // root applies the update.
  AfterPush AcceptPushLocked(int rank, const Block& block,
                             const SumTree::Folding& folding, float loss)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error every request gets once the job failed or is shutting down.
  absl::Status RefusalLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // RefusalLocked for a call of `rank`, which is then told of a failure.
  absl::Status RefusalToLocked(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies Adam to the root's sum, publishes the next version, plans it;
  // returns the waits to finish once the lock is released.
  std::vector<Wake> ApplyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the current step: no sums, no pushes, no backups, then a plan.
  void NewStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Plans again while no block of the step is in (a rank joined or was
  // lost before anyone pushed), and hands lost ranks' blocks and late ones
  // to idle ranks that wait: the waits to finish.
  std::vector<Wake> ReplanOrHandOutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BlockPlanner::AssignWork, counted.
  Block AssignWorkLocked(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BlockPlanner::TakingPart, the first step held for the start wait.
  std::vector<int> TakingPartLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // When the next late block is due, for the straggler thread.
  absl::Time NextLateLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Removes every waiter, returning their callbacks.
  int64_t TotalStepsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The data is known and every step done.
  bool OverLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const ModelLayout layout_;
  const ShardSpec shard_;
  const int64_t n_;  // values of the range this coordinator owns
  const absl::Time started_;
  // Shard 0 (or the one dp-ps) leads: it hands out blocks and work, and
  // watches leases; the other shards only sum what the workers push them.
  const bool lead_;
  mutable absl::Mutex mu_;
  WorkerPool pool_ ABSL_GUARDED_BY(mu_);  // runs the update, under mu_
  JobConfig config_ ABSL_GUARDED_BY(mu_);
  TrainingState state_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_);
  JobData data_ ABSL_GUARDED_BY(mu_);
  // Only an accepted call renews a rank's lease (roster_.Renew): a rank
  // whose every request is refused is not taking part, and must be
  // reported missing.
  RankRoster roster_ ABSL_GUARDED_BY(mu_);
  ElasticOptions elastic_ ABSL_GUARDED_BY(mu_);
  // The step's sums that are in.
  SumTree sums_ ABSL_GUARDED_BY(mu_);
  // By rank: pushed a block this step.
  // Who computes which of the step's blocks.
  BlockPlanner planner_ ABSL_GUARDED_BY(mu_);
  // A leader's straggler backups (BackUpLateBlocks when they fall due).
  std::unique_ptr<DueWatcher> stragglers_;
  // What Pull hands out: the current version's snapshot, and sharded the
  // version before.
  WeightsPublisher weights_ ABSL_GUARDED_BY(mu_);
  float last_loss_ ABSL_GUARDED_BY(mu_) = 0.0f;
  WaitQueue waits_ ABSL_GUARDED_BY(mu_);
  EvalRecord evals_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, StepHook>> step_hooks_ ABSL_GUARDED_BY(mu_);
  StepStats stats_ ABSL_GUARDED_BY(mu_);
  StragglerBackups backups_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::Duration)> update_observer_ ABSL_GUARDED_BY(mu_);
  // When (by elastic_.clock) the first rank registered: the start wait
  // counts from then.
  std::optional<absl::Time> first_registration_ ABSL_GUARDED_BY(mu_);
  UpdateSink update_sink_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dp

#endif  // DP_SERVER_STEP_COORDINATOR_H_
