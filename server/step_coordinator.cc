// Synchronous step protocol: pushes summed in the micro-batch tree, Adam,
// publish.
#include "server/step_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/cpu_time.h"
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

}  // namespace

StepCoordinator::StepCoordinator(ModelLayout layout, JobConfig config,
                                 TrainingState state, int update_threads,
                                 ShardSpec shard)
    : layout_(std::move(layout)),
      shard_(shard.OrWhole(layout_.num_params())),
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
      stats_(config_.schedule.world_size, started_),
      backups_(&planner_, &waits_, &roster_, &stats_) {
  DP_CHECK(config_.schedule.world_size >= 1 &&
           static_cast<int64_t>(state_.params.size()) == n_);
  if (state_.m.empty()) state_.m.assign(n_, 0.0f);
  if (state_.v.empty()) state_.v.assign(n_, 0.0f);
  DP_CHECK(state_.m.size() == state_.params.size() &&
           state_.v.size() == state_.params.size());
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
    DueWatcher::Calls calls;
    calls.run = [this] { return BackUpLateBlocks(); };
    calls.stopped = [this]()
                        ABSL_SHARED_LOCKS_REQUIRED(mu_) { return shutdown_; };
    calls.sooner = [this](absl::Time due) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return NextLateLocked() < due;
    };
    calls.clock = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return elastic_.clock();
    };
    stragglers_ = std::make_unique<DueWatcher>(&mu_, std::move(calls));
  }
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

absl::Status StepCoordinator::CheckRank(const char* rpc, int rank) const {
  return CheckRankInJob(rpc, rank, config_.schedule.world_size);
}

int64_t StepCoordinator::TotalStepsLocked() const {
  return data_.TotalSteps(config_.schedule);
}

bool StepCoordinator::OverLocked() const {
  return data_.Over(state_.step, config_.schedule);
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
  WaitQueue::Run(wakes);
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
  RETURN_IF_ERROR(data_.CheckSame(rank, data));
  // Only the holder itself may register a held rank again (after a re-join,
  // or a restart of another shard): two live processes of one rank would
  // take it from each other at every registration for the rest of the job.
  // Once the job is over there is nothing to take: one standing by joins
  // at the end (and exits 0).
  if (!OverLocked()) {
    RETURN_IF_ERROR(
        roster_.CheckFree(rank, worker_id, now, waiting[rank], elastic_.lease));
  }
  if (!data_.known()) {
    if (absl::Status s = data_.Adopt(data, &config_.schedule); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "rank %d's data cannot run this job: %s", rank, s.message()));
    }
  }
  Log("rank %d registered %sat step %d", rank,
      roster_.registered(rank) ? "again " : "", state_.step);
  const uint64_t session = roster_.Register(rank, worker_id, now);
  if (!first_registration_.has_value()) first_registration_ = elastic_.clock();
  return Registration{config_, state_.step, rank, session};
}

absl::Status StepCoordinator::Attend(int rank, uint64_t session) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RefusalLocked());
  RETURN_IF_ERROR(CheckRank("Attend", rank));
  return roster_.Attend(rank, session);
}

void StepCoordinator::ConnectionClosed(int rank, uint64_t session) {
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    if (!CheckRank("ConnectionClosed", rank).ok()) return;
    if (!roster_.Close(rank, session)) return;
    // The end of the job or of this dp-ps: nobody is missing.
    if (!RefusalLocked().ok() || OverLocked()) return;
    if (lead_ && elastic_.reassign()) roster_.MarkLost(rank);
    wakes = ReplanOrHandOutLocked();
  }
  WaitQueue::Run(wakes);
}

absl::StatusOr<StepCoordinator::PulledWeights> StepCoordinator::Pull(
    int rank, int64_t offset, int64_t length, std::optional<int64_t> version) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(RefusalToLocked(rank));
  RETURN_IF_ERROR(CheckRank("Pull", rank));
  RETURN_IF_ERROR(CheckPullRange(rank, offset, length, shard_.range));
  if (length == 0) length = shard_.range.end() - offset;
  ASSIGN_OR_RETURN(const WeightsPublisher::Snapshot weights,
                   weights_.Serve(rank, version, state_.step, state_.params));
  roster_.Renew(rank, absl::Now());
  const bool current = !version.has_value() || *version == state_.step;
  // Work comes with the current version only.
  const Block block = current ? AssignWorkLocked(rank) : Block{};
  const size_t width = BytesPerValue(config_.weight_encoding);
  return PulledWeights{
      current ? state_.step : *version,
      block,
      config_.weight_encoding,
      weights.lease,
      weights.bytes,
      weights.bytes.substr((offset - shard_.range.offset) * width,
                           length * width)};
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
  roster_.Renew(rank, absl::Now());
  const absl::Time start = absl::Now();
  use(state_.step, state_.params);
  stats_.AddUse(absl::Now() - start);
  return Version{state_.step, AssignWorkLocked(rank)};
}

absl::Status StepCoordinator::ReadGradientLocked(
    int rank, int64_t step, int64_t offset, absl::string_view gradient,
    Encoding encoding, const Block& block, bool counts,
    SumTree::Folding* folding) {
  RETURN_IF_ERROR(CheckGradientEncoding(rank, encoding, config_.grad_encoding));
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
  if (bad.index < 0) return absl::OkStatus();
  return BadGradientValue(rank, step, shard_.range.offset + bad.index,
                          bad.value);
}

absl::StatusOr<bool> StepCoordinator::IsDuplicateLocked(
    int rank, int64_t step, const Block& block) const {
  RETURN_IF_ERROR(roster_.CheckRegistered(rank));
  const int64_t current = state_.step;
  // The step just applied: a retry whose answer was lost, or a late copy.
  if (step == current - 1) return true;
  if (step != current) return OtherStep(rank, "pushed", step, current);
  if (step >= TotalStepsLocked()) {
    return absl::AbortedError(absl::StrFormat(
        "rank %d pushed step %d but the job finished at step %d", rank, step,
        current));
  }
  return sums_.Covered(block);
}

StepCoordinator::AfterPush StepCoordinator::AcceptPushLocked(
    int rank, const Block& block, const SumTree::Folding& folding, float loss) {
  AfterPush after;
  roster_.Renew(rank, absl::Now());
  planner_.Pushed(rank, block, elastic_.clock());
  sums_.Accept(block, folding, loss);
  stats_.Arrived(rank, absl::Now());
  if (sums_.complete()) {
    stats_.CompletedBy(rank);
    after.wakes = ApplyLocked();
    for (const auto& [every, hook] : step_hooks_) {
      if (state_.step % every == 0) after.hooks.push_back(hook);
    }
    if (!after.hooks.empty()) {
      after.state = state_;  // consistent: taken at a step boundary
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
    RETURN_IF_ERROR(CheckPushedBlock(rank, K(), block));
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
      roster_.Renew(rank, absl::Now());
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
  WaitQueue::Run(after.wakes);
  // Each hook its copy; the last takes the one taken under the lock.
  for (size_t i = 0; i < after.hooks.size(); ++i) {
    after.hooks[i](
        i + 1 < after.hooks.size() ? after.state : std::move(after.state),
        after.generation);
  }
  return result;
}

std::vector<StepCoordinator::Wake> StepCoordinator::ApplyLocked() {
  const absl::Time begin = absl::Now();
  const int k = K();
  weights_.BeforeUpdate(state_.params);
  const absl::Time apply_start = absl::Now();
  auto update = [&](EncodedCopy copy) {
    mu_.AssertHeld();
    AdamStepOnSum(config_.adam, state_.step + 1, TotalStepsLocked(),
                  sums_.root(), k, n_, state_.params.data(), state_.m.data(),
                  state_.v.data(), &pool_, copy);
  };
  if (update_sink_) {
    update_sink_(state_.step + 1, update);
  } else {
    update(EncodedCopy{});
  }
  if (update_observer_) update_observer_(absl::Now() - apply_start);
  last_loss_ = sums_.root_loss() / static_cast<float>(k);
  ++state_.step;
  stats_.Applied(state_.step, begin, absl::Now(), planner_.pushed(),
                 ProcessCpuTime());
  planner_.Applied(waits_.Waiting());
  NewStepLocked();
  return waits_.WakeApplied(state_.step);
}

void StepCoordinator::NewStepLocked() {
  sums_.Clear();
  planner_.StartStep(elastic_.clock(), TakingPartLocked());
}

std::vector<int> StepCoordinator::TakingPartLocked() const {
  // The first step waits a while for everyone, counted from the first
  // registration: however long dp-ps waited for its first worker (an
  // image pull, a slow start), the others get the whole wait to follow it.
  const bool hold =
      !stats_.any_applied() && roster_.num_registered() < roster_.world() &&
      (!first_registration_.has_value() ||
       elastic_.clock() - *first_registration_ < elastic_.start_wait);
  return planner_.TakingPart(hold);
}

Block StepCoordinator::AssignWorkLocked(int rank) {
  return planner_.AssignWork(rank, &stats_.counts().blocks_reassigned);
}

std::vector<StepCoordinator::Wake> StepCoordinator::ReplanOrHandOutLocked() {
  if (state_.step >= TotalStepsLocked()) return {};
  planner_.Replan(TakingPartLocked());
  // Orphans (and, with a plan made just now, their own blocks) to the
  // ranks that wait, oldest wait first. (The other shards plan too, to say
  // whom they wait for, but hand nothing out.)
  if (!lead_) return {};
  return waits_.WakeWithWork(state_.step, [&](int rank) {
    mu_.AssertHeld();
    return roster_.lost(rank) ? Block{} : AssignWorkLocked(rank);
  });
}

absl::Time StepCoordinator::NextLateLocked() const {
  if (!lead_ || state_.step >= TotalStepsLocked()) {
    return absl::InfiniteFuture();
  }
  return backups_.NextDue(state_.step);
}

absl::Time StepCoordinator::BackUpLateBlocks() {
  for (;;) {
    std::vector<Wake> wakes;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time due = NextLateLocked();
      if (shutdown_ || due > elastic_.clock()) return due;
      wakes = backups_.BackUpOne(state_.step);
    }
    WaitQueue::Run(wakes);
  }
}

absl::StatusOr<StepCoordinator::WaitTicket> StepCoordinator::WaitForStep(
    int rank, int64_t step, WaitCallback done) {
  std::vector<Wake> evicted;
  absl::StatusOr<WaitTicket> ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = WaitForStepLocked(rank, step, std::move(done), &evicted);
  }
  WaitQueue::Run(evicted);
  return ticket;
}

absl::StatusOr<StepCoordinator::WaitTicket> StepCoordinator::WaitForStepLocked(
    int rank, int64_t step, WaitCallback done, std::vector<Wake>* evicted) {
  RETURN_IF_ERROR(RefusalToLocked(rank));
  RETURN_IF_ERROR(CheckRank("WaitForStep", rank));
  RETURN_IF_ERROR(roster_.CheckRegistered(rank));
  const int64_t current = state_.step;
  if (step > current) return OtherStep(rank, "waits for", step, current);
  if (step < current) {
    roster_.Renew(rank, absl::Now());
    return WaitTicket{true, current, 0, Block{}};
  }
  roster_.Renew(rank, absl::Now());
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
  roster_.Renew(rank, absl::Now());
  evals_.Record(r);
  return absl::OkStatus();
}

bool StepCoordinator::done() const {
  absl::ReaderMutexLock lock(&mu_);
  return OverLocked();
}

bool StepCoordinator::AwaitDone(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || !failed_.ok() || OverLocked();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout) && !shutdown_ &&
         failed_.ok();
}

bool StepCoordinator::AwaitFinalEval(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return shutdown_ || evals_.final_came();
  };
  return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout) &&
         evals_.final_came();
}

void StepCoordinator::Shutdown() {
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    wakes = waits_.WakeAll(Unavailable(), state_.step);
  }
  WaitQueue::Run(wakes);
}

void StepCoordinator::SetUpdateObserver(
    std::function<void(absl::Duration)> observer) {
  absl::MutexLock lock(&mu_);
  update_observer_ = std::move(observer);
}

void StepCoordinator::SetUpdateSink(UpdateSink sink) {
  absl::MutexLock lock(&mu_);
  update_sink_ = std::move(sink);
}

void StepCoordinator::Fail(const absl::Status& reason) {
  // Workers stop only on this code and prefix; anything else would have
  // them retry or re-sync against a job that is over.
  DP_CHECK(IsJobFailed(reason));
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return;
    failed_ = reason;
    const std::vector<bool> waiting = waits_.Waiting();
    for (size_t r = 0; r < waiting.size(); ++r) {
      if (waiting[r]) roster_.Tell(r);
    }
    wakes = waits_.WakeAll(reason, state_.step);
  }
  WaitQueue::Run(wakes);
}

absl::Status StepCoordinator::Rewind(uint64_t generation, TrainingState state) {
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(RefusalLocked());
    RETURN_IF_ERROR(CheckRollback(shard_, generation, generation_, state));
    if (state.step == state_.step) return absl::OkStatus();
    Log("%s: rolled back from step %d to step %d", shard_.ToString(),
        state_.step, state.step);
    state_ = std::move(state);
    generation_ = RandomId();
    weights_.Reset();
    NewStepLocked();
    wakes = waits_.WakeAll(
        absl::AbortedError(absl::StrFormat("%s rolled back to step %d: re-sync",
                                           shard_.ToString(), state_.step)),
        state_.step);
  }
  WaitQueue::Run(wakes);
  return absl::OkStatus();
}

absl::Status StepCoordinator::RestoreData(const DataFingerprint& data) {
  absl::MutexLock lock(&mu_);
  return data_.Adopt(data, &config_.schedule);
}

std::optional<DataFingerprint> StepCoordinator::data() const {
  absl::ReaderMutexLock lock(&mu_);
  return data_.Get();
}

void StepCoordinator::AddStepHook(int64_t every, StepHook hook) {
  absl::MutexLock lock(&mu_);
  DP_CHECK(every > 0);
  step_hooks_.emplace_back(every, std::move(hook));
}

std::vector<StepCoordinator::LeaseEvent> StepCoordinator::CheckLeases(
    absl::Duration timeout) {
  std::vector<LeaseEvent> events;
  std::vector<Wake> wakes;
  {
    absl::MutexLock lock(&mu_);
    // The leader's business, while the job runs.
    if (!lead_ || OverLocked()) return {};
    events = roster_.CheckLeases(absl::Now(), waits_.Waiting(), timeout,
                                 elastic_.reassign());
    wakes = ReplanOrHandOutLocked();
  }
  WaitQueue::Run(wakes);
  return events;
}

TrainingState StepCoordinator::Snapshot() const {
  absl::ReaderMutexLock lock(&mu_);
  return state_;
}

}  // namespace dp
