// Synchronous step protocol: pushes summed in the micro-batch tree, Adam,
// publish.
#include "server/step_coordinator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_failure.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/request_validator.h"

namespace dp {
namespace {

absl::Status Unavailable() {
  return absl::UnavailableError("dp-ps is shutting down");
}

// ABORTED for a call about another step than the job's: the worker re-syncs.
absl::Status OtherStep(int rank, const char* does, int64_t step,
                       int64_t current) {
  return absl::AbortedError(absl::StrFormat(
      "rank %d %s step %d but the job is at step %d (%s step): re-sync", rank,
      does, step, current, step < current ? "stale" : "future"));
}

// A coordinator for the whole vector unless told otherwise.
ShardSpec Normalized(ShardSpec shard, const ModelLayout& layout) {
  if (shard.count <= 1) {
    shard.index = 0;
    shard.count = 1;
    shard.range = ParamRange{0, layout.num_params()};
  }
  return shard;
}

}  // namespace

StepCoordinator::StepCoordinator(ModelLayout layout, JobConfig config,
                                 TrainingState state, int update_threads,
                                 ShardSpec shard)
    : layout_(std::move(layout)),
      shard_(Normalized(shard, layout_)),
      n_(shard_.range.length),
      started_(absl::Now()),
      lead_(shard_.index == 0),
      pool_(update_threads),
      config_(std::move(config)),
      state_(std::move(state)),
      generation_(RandomId()),
      roster_(config_.schedule.world_size, started_),
      sums_(config_.schedule.num_micro_batches(), n_),
      planner_(config_.schedule.num_micro_batches(), config_.live_minimum(),
               lead_, &roster_, &sums_),
      weights_(n_, config_.weight_encoding, shard_.count > 1),
      waits_(config_.schedule.world_size),
      stats_(config_.schedule.world_size, started_) {
  const int64_t n = n_;
  DP_CHECK(static_cast<int64_t>(state_.params.size()) == n);
  if (state_.m.empty()) state_.m.assign(n, 0.0f);
  if (state_.v.empty()) state_.v.assign(n, 0.0f);
  DP_CHECK(static_cast<int64_t>(state_.m.size()) == n &&
           static_cast<int64_t>(state_.v.size()) == n);
  const int world = config_.schedule.world_size;
  DP_CHECK(world >= 1);
  received_.assign(world, false);
}

StepCoordinator::~StepCoordinator() {
  Shutdown();
  stragglers_.reset();  // joins: Shutdown ended its watch
}

void StepCoordinator::SetElastic(const ElasticOptions& options) {
  absl::MutexLock lock(&mu_);
  elastic_ = options;
  planner_.Configure(elastic_, elastic_.clock());
  if (lead_ && elastic_.backup_blocks > 0 && stragglers_ == nullptr) {
    // Woken only when a block falls due sooner (evaluated by whoever
    // releases the lock), or then; a test that moves its clock past that
    // meanwhile calls BackUpLateBlocks itself.
    stragglers_ = std::make_unique<DueWatcher>(
        &mu_, DueWatcher::Calls{[this] { return BackUpLateBlocks(); },
                                [this] {
                                  mu_.AssertReaderHeld();
                                  return shutdown_;
                                },
                                [this](absl::Time due) {
                                  mu_.AssertReaderHeld();
                                  return NextLateLocked() < due;
                                },
                                [this] {
                                  mu_.AssertReaderHeld();
                                  return elastic_.clock();
                                }});
  }
}

void StepCoordinator::RunWakes(std::vector<Wake>& wakes) {
  for (Wake& w : wakes) w.done(w.status, w.step, w.work);
}

bool StepCoordinator::CoveredLocked(const Block& b) const {
  return sums_.Covered(b);
}

absl::Status StepCoordinator::RefusalLocked() const {
  if (!failed_.ok()) return failed_;
  if (shutdown_) return Unavailable();
  return absl::OkStatus();
}

absl::Status StepCoordinator::RefusalToLocked(int rank) {
  absl::Status refusal = RefusalLocked();
  if (!failed_.ok() && rank >= 0 && rank < roster_.world()) {
    roster_.Tell(rank);
  }
  return refusal;
}

bool StepCoordinator::AwaitFailureTold(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto told = [this]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return roster_.AllTold(); };
  return mu_.AwaitWithTimeout(absl::Condition(&told), timeout);
}

std::vector<int> StepCoordinator::AwaitRanksGone(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  std::vector<int> held;
  auto gone = [this, &held]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    held =
        roster_.AttendingRanks(absl::Now(), waits_.Waiting(), elastic_.lease);
    return held.empty();
  };
  // A close wakes the wait; a lease running out does not, hence the slices.
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (mu_.AwaitWithTimeout(absl::Condition(&gone),
                             std::min(left, absl::Milliseconds(100))) ||
        left <= absl::ZeroDuration()) {
      return held;
    }
  }
}

void StepCoordinator::RenewLeaseLocked(int rank) {
  roster_.Renew(rank, absl::Now());
}

absl::Status StepCoordinator::CheckRegisteredLocked(int rank) const {
  if (roster_.registered(rank)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("rank %d has not registered", rank));
}

absl::Status StepCoordinator::CheckRank(const char* rpc, int rank) const {
  return CheckRankInJob(rpc, rank, config_.schedule.world_size);
}

int64_t StepCoordinator::TotalStepsLocked() const {
  return have_data_ ? config_.schedule.total_steps() : 0;
}

absl::StatusOr<StepCoordinator::Registration> StepCoordinator::Register(
    int rank, uint64_t model_fingerprint, const DataFingerprint& data,
    absl::string_view worker_id, int preferred) {
  std::vector<Wake> wakes;
  absl::StatusOr<Registration> r;
  {
    absl::MutexLock lock(&mu_);
    r = RegisterLocked(rank, model_fingerprint, data, worker_id, preferred);
    if (r.ok()) wakes = ReplanOrHandOutLocked();
  }
  RunWakes(wakes);
  return r;
}

absl::StatusOr<StepCoordinator::Registration> StepCoordinator::RegisterLocked(
    int rank, uint64_t model_fingerprint, const DataFingerprint& data,
    absl::string_view worker_id, int preferred) {
  RETURN_IF_ERROR(RefusalLocked());
  const absl::Time now = absl::Now();
  const std::vector<bool> waiting = waits_.Waiting();
  if (rank == kAnyRank) {
    rank = roster_.Choose(worker_id, preferred, now, waiting, elastic_.lease);
    if (rank < 0) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the job has its %d workers (--workers), all live: no rank is free",
          roster_.world()));
    }
  }
  RETURN_IF_ERROR(CheckRank("Register", rank));
  RETURN_IF_ERROR(
      CheckModelFingerprint(rank, model_fingerprint, layout_.Fingerprint()));
  if (have_data_ && !(data == data_)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d has different data (%d samples, hash %016x) from the job's "
        "(%d samples, hash %016x): check --data_dir",
        rank, data.num_samples, data.hash, data_.num_samples, data_.hash));
  }
  // Only the holder itself may register a held rank again (after a re-join,
  // or a restart of another shard): two live processes of one rank would
  // take it from each other at every registration for the rest of the job.
  // Once the job is over there is nothing to take: one standing by joins
  // at the end (and exits 0).
  const bool over = have_data_ && state_.step >= TotalStepsLocked();
  if (!over) {
    RETURN_IF_ERROR(
        roster_.CheckFree(rank, worker_id, now, waiting[rank], elastic_.lease));
  }
  if (!have_data_) {
    Schedule schedule = config_.schedule;
    schedule.num_samples = data.num_samples;
    if (absl::Status s = ValidateSchedule(schedule); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d's data cannot run this job: %s", rank, s.message()));
    }
    config_.schedule = schedule;
    data_ = data;
    have_data_ = true;
  }
  Log("rank %d registered %sat step %d", rank,
      roster_.registered(rank) ? "again " : "", state_.step);
  const uint64_t session = roster_.Register(rank, worker_id, now);
  return Registration{config_, state_.step, rank, session};
}

absl::Status StepCoordinator::Attend(int rank, uint64_t session) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RefusalLocked());
  RETURN_IF_ERROR(CheckRank("Attend", rank));
  if (!roster_.registered(rank) || roster_.session(rank) != session) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Attend: session %016x is not rank %d's registration (%s)", session,
        rank,
        roster_.registered(rank) ? "it registered again" : "not registered"));
  }
  roster_.Attended(rank);
  return absl::OkStatus();
}

void StepCoordinator::ConnectionClosed(int rank, uint64_t session) {
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    if (!CheckRank("ConnectionClosed", rank).ok()) return;
    if (!roster_.Close(rank, session)) return;
    // The end of the job or of this dp-ps: nobody is missing.
    if (!RefusalLocked().ok() ||
        (have_data_ && state_.step >= TotalStepsLocked())) {
      return;
    }
    if (lead_ && elastic_.reassign()) roster_.MarkLost(rank);
    wakes = ReplanOrHandOutLocked();
  }
  RunWakes(wakes);
}

absl::StatusOr<StepCoordinator::PulledWeights> StepCoordinator::Pull(
    int rank, int64_t offset, int64_t length, std::optional<int64_t> version) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RefusalToLocked(rank));
  RETURN_IF_ERROR(CheckRank("Pull", rank));
  RETURN_IF_ERROR(CheckPullRange(rank, offset, length, shard_.range));
  const int64_t begin = shard_.range.offset;
  if (length == 0) length = shard_.range.end() - offset;
  const Encoding encoding = config_.weight_encoding;
  const size_t width = BytesPerValue(encoding);
  const int64_t local = offset - begin;
  if (version.has_value() && *version != state_.step) {
    if (*version != state_.step - 1 || !weights_.holds_previous()) {
      // An older version: the job moved on since the caller looked
      // (ABORTED: it looks again); any other is no version of this job.
      const bool moved_on = *version >= 0 && *version < state_.step;
      return absl::Status(
          moved_on ? absl::StatusCode::kAborted
                   : absl::StatusCode::kFailedPrecondition,
          absl::StrFormat(
              "rank %d asks for the weights of version %d; this "
              "dp-ps is at version %d and holds %s",
              rank, *version, state_.step,
              weights_.holds_previous() ? "the one before too" : "no other"));
    }
    RenewLeaseLocked(rank);
    const WeightsPublisher::Snapshot previous = weights_.Previous();
    return PulledWeights{
        *version,       Block{},
        encoding,       previous.lease,
        previous.bytes, previous.bytes.substr(local * width, length * width)};
  }
  RenewLeaseLocked(rank);
  const Block block = AssignWorkLocked(rank);
  const WeightsPublisher::Snapshot current = weights_.Current(state_.params);
  return PulledWeights{
      state_.step,   block,
      encoding,      current.lease,
      current.bytes, current.bytes.substr(local * width, length * width)};
}

absl::StatusOr<StepCoordinator::Version> StepCoordinator::WithCurrentWeights(
    int rank,
    absl::FunctionRef<void(int64_t step, absl::Span<const float> params)> use,
    std::optional<int64_t> version) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RefusalToLocked(rank));
  RETURN_IF_ERROR(CheckRank("Pull", rank));
  if (version.has_value() && *version != state_.step) {
    return absl::AbortedError(
        absl::StrFormat("rank %d asks for version %d; the current one is %d",
                        rank, *version, state_.step));
  }
  RenewLeaseLocked(rank);
  const absl::Time start = absl::Now();
  use(state_.step, state_.params);
  stats_.AddUse(absl::Now() - start);
  return Version{state_.step, AssignWorkLocked(rank)};
}

absl::Status StepCoordinator::ReadGradientLocked(
    int rank, int64_t step, int64_t offset, absl::string_view gradient,
    Encoding encoding, const Block& block, bool counts,
    SumTree::Folding* folding) {
  if (encoding != config_.grad_encoding) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gradient from rank %d is encoded as %s; this job uses %s", rank,
        EncodingName(encoding), EncodingName(config_.grad_encoding)));
  }
  // Never read past the buffer, whoever calls.
  RETURN_IF_ERROR(CheckGradientShape(rank, encoding, offset, gradient.size(),
                                     shard_.range));
  // The bytes may be a worker's shared-memory slot, which it can rewrite at
  // any time: they are read once, into private memory, and every decision
  // is made on that copy. A push that counts is added as it is read to the
  // sum of its sibling, and of the siblings up the tree that are in (each
  // addition is one node's: a + b, and a + b == b + a), into the spare
  // buffer, which becomes that node's sum when the push is accepted; one
  // that cannot count is read to scratch, only to be checked. A refused
  // push leaves no trace either way.
  const SumTree::BadValue bad =
      counts ? sums_.Read(block, encoding, gradient, kMaxAbsGradient, &pool_,
                          folding)
             : sums_.Check(encoding, gradient, kMaxAbsGradient);
  if (bad.index >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "gradient from rank %d for step %d has a non-finite or out-of-range "
        "value (%g, limit %g) at index %d",
        rank, step, bad.value, kMaxAbsGradient,
        shard_.range.offset + bad.index));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> StepCoordinator::IsDuplicateLocked(
    int rank, int64_t step, const Block& block) const {
  RETURN_IF_ERROR(CheckRegisteredLocked(rank));
  const int64_t current = state_.step;
  // The step just applied: a retry whose answer was lost, or a late copy.
  if (step == current - 1) return true;
  if (step != current) return OtherStep(rank, "pushed", step, current);
  if (step >= TotalStepsLocked()) {
    return absl::AbortedError(absl::StrFormat(
        "rank %d pushed step %d but the job finished at step %d", rank, step,
        current));
  }
  return CoveredLocked(block);
}

StepCoordinator::AfterPush StepCoordinator::AcceptPushLocked(
    int rank, const Block& block, const SumTree::Folding& folding, float loss) {
  AfterPush after;
  RenewLeaseLocked(rank);
  planner_.Pushed(rank, block, elastic_.clock());
  sums_.Accept(block, folding, loss);
  received_[rank] = true;
  stats_.Arrived(rank, absl::Now());
  if (sums_.complete()) {
    stats_.CompletedBy(rank);
    after.wakes = ApplyLocked();
    if (checkpoint_hook_ && state_.step % checkpoint_every_ == 0) {
      after.checkpoint_hook = checkpoint_hook_;
      after.checkpoint = state_;  // consistent: taken at a step boundary
      after.generation = generation_;
    }
  }
  return after;
}

absl::StatusOr<StepCoordinator::PushResult> StepCoordinator::Push(
    int rank, int64_t step, int64_t offset, absl::string_view gradient,
    float loss, Encoding encoding, Block block) {
  AfterPush after;
  PushResult result;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(RefusalToLocked(rank));
    RETURN_IF_ERROR(CheckRank("Push", rank));
    if (block.empty()) block = Block{rank, 1};
    // Like the gradient's shape, whatever the step.
    if (!IsNode(K(), block)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "rank %d pushed micro-batches %s, which is not a block of the "
          "step's %d micro-batches",
          rank, block.ToString(), K()));
    }
    // Whether it can count decides only where it is read; the values are
    // checked first, before anything that depends on the step, so that a
    // bad gradient is INVALID_ARGUMENT whatever the state.
    const absl::StatusOr<bool> retry = IsDuplicateLocked(rank, step, block);
    SumTree::Folding folding;
    const absl::Time read_start = absl::Now();
    const absl::Status read =
        ReadGradientLocked(rank, step, offset, gradient, encoding, block,
                           retry.ok() && !*retry, &folding);
    stats_.AddRead(absl::Now() - read_start);
    RETURN_IF_ERROR(read);
    RETURN_IF_ERROR(retry.status());
    if (*retry) {
      RenewLeaseLocked(rank);
      // A copy of a block that is in, or of the step just applied (a late
      // straggler's, or a retry whose answer was lost).
      ++stats_.counts().duplicate_pushes;
      if (step == state_.step) planner_.Computed(rank, block);
      return PushResult{state_.step, /*duplicate=*/true};
    }
    RETURN_IF_ERROR(CheckLoss(rank, step, loss));
    after = AcceptPushLocked(rank, block, folding, loss);
    result.step = state_.step;
  }
  RunWakes(after.wakes);
  if (after.checkpoint_hook) {
    after.checkpoint_hook(std::move(after.checkpoint), after.generation);
  }
  return result;
}

std::vector<StepCoordinator::Wake> StepCoordinator::ApplyLocked() {
  const absl::Time begin = absl::Now();
  const int k = K();
  weights_.BeforeUpdate(state_.params);
  const absl::Time apply_start = absl::Now();
  AdamStepOnSum(config_.adam, state_.step + 1, sums_.root(), k, n_,
                state_.params.data(), state_.m.data(), state_.v.data(), &pool_);
  if (update_observer_) update_observer_(absl::Now() - apply_start);
  last_loss_ = sums_.root_loss() / static_cast<float>(k);
  ++state_.step;
  stats_.Applied(state_.step, begin, absl::Now(), received_);
  planner_.Applied(received_, waits_.Waiting());
  NewStepLocked();
  std::vector<Wake> ready;
  for (WaitQueue::Taken& t : waits_.TakeWhere(
           [&](int, int64_t step) { return step < state_.step; })) {
    ready.push_back(Wake{std::move(t.done), absl::OkStatus(), state_.step, {}});
  }
  return ready;
}

void StepCoordinator::NewStepLocked() {
  sums_.Clear();
  received_.assign(received_.size(), false);
  planner_.StartStep(elastic_.clock(), TakingPartLocked());
}

std::vector<int> StepCoordinator::TakingPartLocked() const {
  // The first step waits a while for everyone.
  const bool hold = !stats_.any_applied() &&
                    roster_.num_registered() < roster_.world() &&
                    absl::Now() - started_ < elastic_.start_wait;
  return planner_.TakingPart(hold);
}

Block StepCoordinator::AssignWorkLocked(int rank) {
  return planner_.AssignWork(rank, &stats_.counts().blocks_reassigned);
}

std::vector<StepCoordinator::Wake> StepCoordinator::ReplanOrHandOutLocked() {
  std::vector<Wake> wakes;
  if (state_.step >= TotalStepsLocked()) return wakes;
  planner_.Replan(TakingPartLocked());
  // Orphans (and, with a plan made just now, their own blocks) to the
  // ranks that wait, oldest wait first. (The other shards plan too, to say
  // whom they wait for, but hand nothing out.)
  if (!lead_) return wakes;
  std::vector<Block> works;  // of the waits taken, in their order
  std::vector<WaitQueue::Taken> taken =
      waits_.TakeWhere([&](int rank, int64_t step) {
        if (step != state_.step || roster_.lost(rank)) return false;
        const Block work = AssignWorkLocked(rank);
        if (work.empty()) return false;
        works.push_back(work);
        return true;
      });
  for (size_t i = 0; i < taken.size(); ++i) {
    wakes.push_back(Wake{std::move(taken[i].done), absl::OkStatus(),
                         state_.step, works[i]});
  }
  return wakes;
}

bool StepCoordinator::IdleWaitLocked() const {
  return waits_.Any([&](int rank, int64_t step) {
    return step == state_.step && !roster_.lost(rank);
  });
}

absl::Time StepCoordinator::NextLateLocked() const {
  if (!lead_ || state_.step >= TotalStepsLocked() || !IdleWaitLocked()) {
    return absl::InfiniteFuture();
  }
  return planner_.LateDue();
}

absl::Time StepCoordinator::BackUpLateBlocks() {
  for (;;) {
    std::vector<Wake> wakes;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time due = NextLateLocked();
      if (shutdown_ || due > elastic_.clock()) return due;
      wakes = BackUpLateBlockLocked();
    }
    RunWakes(wakes);
  }
}

std::vector<StepCoordinator::Wake> StepCoordinator::BackUpLateBlockLocked() {
  const Block late = planner_.LateBlock(waits_.Waiting());
  if (late.empty()) return {};
  // To the oldest idle wait.
  std::optional<WaitQueue::Taken> idle =
      waits_.TakeFirst([&](int rank, int64_t step) {
        return step == state_.step && !roster_.lost(rank);
      });
  if (!idle.has_value()) return {};
  std::vector<Wake> wakes;
  wakes.push_back(
      Wake{std::move(idle->done), absl::OkStatus(), state_.step, late});
  planner_.BackUp(idle->rank, late);
  ++stats_.counts().backups_handed;
  return wakes;
}

std::vector<StepCoordinator::WaitCallback>
StepCoordinator::TakeAllWaitersLocked() {
  std::vector<WaitCallback> all;
  for (WaitQueue::Taken& t : waits_.TakeAll()) all.push_back(std::move(t.done));
  return all;
}

absl::StatusOr<StepCoordinator::WaitTicket> StepCoordinator::WaitForStep(
    int rank, int64_t step, WaitCallback done) {
  WaitCallback evicted;
  WaitTicket ticket;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(ticket,
                     WaitForStepLocked(rank, step, std::move(done), &evicted));
  }
  if (evicted) {
    evicted(absl::AbortedError(absl::StrFormat(
                "rank %d has more than %d calls waiting: the oldest is "
                "dropped",
                rank, kMaxWaitsPerRank)),
            ticket.step, Block{});
  }
  return ticket;
}

absl::StatusOr<StepCoordinator::WaitTicket> StepCoordinator::WaitForStepLocked(
    int rank, int64_t step, WaitCallback done, WaitCallback* evicted) {
  RETURN_IF_ERROR(RefusalToLocked(rank));
  RETURN_IF_ERROR(CheckRank("WaitForStep", rank));
  RETURN_IF_ERROR(CheckRegisteredLocked(rank));
  const int64_t current = state_.step;
  if (step > current) return OtherStep(rank, "waits for", step, current);
  if (step < current) {
    RenewLeaseLocked(rank);
    return WaitTicket{true, current, 0, Block{}};
  }
  RenewLeaseLocked(rank);
  // Its own block not pushed yet, or one handed to it: that first.
  if (const Block work = AssignWorkLocked(rank); !work.empty()) {
    return WaitTicket{true, current, 0, work};
  }
  const int64_t id =
      waits_.Add(rank, step, std::move(done), kMaxWaitsPerRank, evicted);
  return WaitTicket{false, current, id, Block{}};
}

bool StepCoordinator::CancelWait(int64_t id) {
  absl::MutexLock lock(&mu_);
  return waits_.Cancel(id);
}

absl::Status StepCoordinator::RecordEval(int rank, const EvalReport& r) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RefusalToLocked(rank));
  RETURN_IF_ERROR(CheckRank("ReportEval", rank));
  RETURN_IF_ERROR(CheckEvalReport(rank, r));
  if (r.step > state_.step) {
    return OtherStep(rank, "reports the evaluation of", r.step, state_.step);
  }
  RenewLeaseLocked(rank);
  last_eval_ = r;
  has_eval_ = true;
  if (r.final) final_eval_ = true;
  Log("%s test accuracy %.4f, loss %.4f (%d images, weights of step %d, "
      "epoch %d)",
      r.final ? "final" : "epoch", r.accuracy, r.loss, r.num_samples, r.step,
      r.epoch);
  return absl::OkStatus();
}

bool StepCoordinator::done() const {
  absl::ReaderMutexLock lock(&mu_);
  return have_data_ && state_.step >= TotalStepsLocked();
}

bool StepCoordinator::AwaitDone(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || !failed_.ok() ||
           (have_data_ && state_.step >= TotalStepsLocked());
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout) && !shutdown_ &&
         failed_.ok();
}

bool StepCoordinator::AwaitFinalEval(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || final_eval_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) && final_eval_;
}

void StepCoordinator::Shutdown() {
  std::vector<WaitCallback> to_fail;
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    step = state_.step;
    to_fail = TakeAllWaitersLocked();
  }
  for (WaitCallback& cb : to_fail) cb(Unavailable(), step, Block{});
}

void StepCoordinator::SetUpdateObserver(
    std::function<void(absl::Duration)> observer) {
  absl::MutexLock lock(&mu_);
  update_observer_ = std::move(observer);
}

void StepCoordinator::Fail(const absl::Status& reason) {
  // Workers stop only on this code and prefix; anything else would have
  // them retry or re-sync against a job that is over.
  DP_CHECK(IsJobFailed(reason));
  std::vector<WaitCallback> to_fail;
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return;
    failed_ = reason;
    step = state_.step;
    const std::vector<bool> waiting = waits_.Waiting();
    for (size_t r = 0; r < waiting.size(); ++r) {
      if (waiting[r]) roster_.Tell(r);
    }
    to_fail = TakeAllWaitersLocked();
  }
  for (WaitCallback& cb : to_fail) cb(reason, step, Block{});
}

absl::Status StepCoordinator::Rewind(uint64_t generation, TrainingState state) {
  std::vector<WaitCallback> to_abort;
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(RefusalLocked());
    if (generation != generation_) {
      return absl::AbortedError(absl::StrFormat(
          "rollback refused: %s changed since it was decided (generation "
          "%016x, now %016x); re-sync",
          shard_.ToString(), generation, generation_));
    }
    if (static_cast<int64_t>(state.params.size()) != n_ ||
        static_cast<int64_t>(state.m.size()) != n_ ||
        static_cast<int64_t>(state.v.size()) != n_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("rollback state has %d values; %s has %d",
                          state.params.size(), shard_.ToString(), n_));
    }
    if (state.step == state_.step) return absl::OkStatus();
    Log("%s: rolled back from step %d to step %d", shard_.ToString(),
        state_.step, state.step);
    state_ = std::move(state);
    step = state_.step;
    generation_ = RandomId();
    weights_.Reset();
    NewStepLocked();
    to_abort = TakeAllWaitersLocked();
  }
  const absl::Status aborted = absl::AbortedError(absl::StrFormat(
      "%s rolled back to step %d: re-sync", shard_.ToString(), step));
  for (WaitCallback& cb : to_abort) cb(aborted, step, Block{});
  return absl::OkStatus();
}

absl::Status StepCoordinator::RestoreData(const DataFingerprint& data) {
  absl::MutexLock lock(&mu_);
  Schedule schedule = config_.schedule;
  schedule.num_samples = data.num_samples;
  RETURN_IF_ERROR(ValidateSchedule(schedule));
  config_.schedule = schedule;
  data_ = data;
  have_data_ = true;
  return absl::OkStatus();
}

std::optional<DataFingerprint> StepCoordinator::data() const {
  absl::ReaderMutexLock lock(&mu_);
  if (!have_data_) return std::nullopt;
  return data_;
}

void StepCoordinator::SetCheckpointHook(
    int64_t every, std::function<void(TrainingState, uint64_t)> hook) {
  absl::MutexLock lock(&mu_);
  checkpoint_every_ = every;
  checkpoint_hook_ = every > 0 ? std::move(hook) : nullptr;
}

std::vector<StepCoordinator::LeaseEvent> StepCoordinator::CheckLeases(
    absl::Duration timeout) {
  std::vector<LeaseEvent> events;
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    events = CheckLeasesLocked(timeout);
    wakes = ReplanOrHandOutLocked();
  }
  RunWakes(wakes);
  return events;
}

std::vector<StepCoordinator::LeaseEvent> StepCoordinator::CheckLeasesLocked(
    absl::Duration timeout) {
  if (!lead_) return {};  // the leader's business
  if (have_data_ && state_.step >= TotalStepsLocked()) return {};
  return roster_.CheckLeases(absl::Now(), waits_.Waiting(), timeout,
                             elastic_.reassign());
}

TrainingState StepCoordinator::Snapshot() const {
  absl::ReaderMutexLock lock(&mu_);
  return state_;
}

CoordinatorStatus StepCoordinator::Status() const {
  absl::ReaderMutexLock lock(&mu_);
  CoordinatorStatus s;
  s.config = config_;
  s.shard = shard_;
  s.generation = generation_;
  s.holds_previous = weights_.holds_previous();
  s.step = state_.step;
  s.total_steps = TotalStepsLocked();
  for (int r = 0; r < config_.schedule.world_size; ++r) {
    if (roster_.registered(r)) s.registered_ranks.push_back(r);
    if (received_[r]) s.pushed_ranks.push_back(r);
    if (roster_.Live(r)) s.live_ranks.push_back(r);
  }
  const bool planned = planner_.planned();
  const std::vector<Block>& work = planner_.work();
  for (int r = 0; r < config_.schedule.world_size; ++r) {
    const bool waits = planned ? !work[r].empty() && !CoveredLocked(work[r])
                               : !roster_.Live(r);
    if (waits) s.waits_for.push_back(r);
  }
  s.plan = planner_.plan();
  s.micro_batches = K();
  s.elastic = stats_.counts();
  s.last_completed_by = stats_.last_completed_by();
  s.completed_by = stats_.completed_by();
  s.last_plan_blocks = planner_.last_plan_blocks();
  s.done = have_data_ && state_.step >= s.total_steps;
  s.failed = !failed_.ok();
  s.last_loss = last_loss_;
  s.has_eval = has_eval_;
  s.last_eval = last_eval_;
  s.times = stats_.times();
  s.snapshots = weights_.snapshots_made();
  return s;
}

}  // namespace dp
