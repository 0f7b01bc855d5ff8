// Worker loop: load, join, then compute -> exchange per step, re-joining on
// ABORTED or a dp-ps that no longer knows this rank.
#include "worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/cpu_time.h"
#include "common/job_failure.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace dp {
namespace {

// A re-join that does not lead to a completed step, repeated this often,
// means something other than a restart is wrong.
constexpr int kMaxResyncsInARow = 20;

// Samples per gathered chunk of the test set: at most the backend's batch.
constexpr int kEvalChunk = 1000;

// Runs one call to dp-ps and records how long it took.
template <typename Call>
absl::Status Timed(WorkerMetrics& metrics, WorkerMetrics::Call what,
                   Call call) {
  const absl::Time start = absl::Now();
  absl::Status s = call();
  metrics.ObserveCall(what, absl::Now() - start);
  return s;
}

// What must be the same in every plan dp-ps hands this process: the data
// and the buffers were made for it. (epochs and max_steps may change.)
absl::Status CheckSameJob(const JobConfig& loaded, const JobConfig& now) {
  if (now.dataset == loaded.dataset && now.layers == loaded.layers &&
      now.tensors == loaded.tensors &&
      now.schedule.batch_size == loaded.schedule.batch_size &&
      now.schedule.num_micro_batches() == loaded.schedule.num_micro_batches() &&
      now.schedule.seed == loaded.schedule.seed &&
      now.grad_encoding == loaded.grad_encoding) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "dp-ps now runs another job (%s, MLP %s, %d micro-batches x %d, seed "
      "%d, %s gradients) than the one this worker joined (%s, MLP %s, %d x "
      "%d, seed %d, %s): restart the worker",
      now.dataset, MlpDimsString(now.layers), now.schedule.num_micro_batches(),
      now.schedule.batch_size, now.schedule.seed,
      EncodingName(now.grad_encoding), loaded.dataset,
      MlpDimsString(loaded.layers), loaded.schedule.num_micro_batches(),
      loaded.schedule.batch_size, loaded.schedule.seed,
      EncodingName(loaded.grad_encoding)));
}

}  // namespace

Trainer::Trainer(PsGroup* client, TrainerOptions options)
    : client_(client),
      options_(std::move(options)),
      rank_(options_.rank),
      unexported_(options_.metrics == nullptr
                      ? std::make_unique<WorkerMetrics>(rank_)
                      : nullptr),
      metrics_(options_.metrics != nullptr ? *options_.metrics : *unexported_) {
}

Trainer::~Trainer() = default;

absl::Status Trainer::Load() {
  const int rank = options_.rank;
  // The job's configuration lives in dp-ps: ask before loading any data.
  ASSIGN_OR_RETURN(const JobStatus job, client_->GetStatus());
  loaded_ = job.config;
  const Schedule& s = loaded_.schedule;
  if (rank != TrainerOptions::kAnyRank && (rank < 0 || rank >= s.world_size)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d is out of range: the job has at most %d workers", rank,
        s.world_size));
  }
  // Fixed gradients would silently wreck a real model: the benchmark backend
  // joins only jobs on the synthetic data, which train nothing anyone keeps.
  if (options_.backend.null() && loaded_.dataset != "synthetic") {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the null backend is for benchmarks (it computes no gradient) and "
        "joins only --dataset=synthetic jobs; this one trains %s",
        loaded_.dataset));
  }
  // The model is the job's, as the data set is: dp-ps says which.
  ASSIGN_OR_RETURN(const ModelLayout layout, JobMlp(loaded_));
  ASSIGN_OR_RETURN(train_, LoadDataset(loaded_.dataset, options_.data_dir,
                                       s.seed, Split::kTrain));
  RETURN_IF_ERROR(
      CheckFitsModel(train_, layout.input_dim(), layout.num_classes()));
  if (rank == 0) RETURN_IF_ERROR(LoadTestSet(layout));
  BackendOptions backend_options;
  backend_options.max_batch = std::max(s.batch_size, kEvalChunk);
  backend_options.cpu_threads = options_.cpu_threads;
  backend_options.tf32 = options_.tf32;
  ASSIGN_OR_RETURN(backend_, options_.backend.Create(layout, backend_options));
  Log("%s: %d training samples of %s, MLP %s, backend %s",
      rank == TrainerOptions::kAnyRank ? std::string("worker")
                                       : absl::StrCat("rank ", rank),
      train_.num_samples, loaded_.dataset, MlpDimsString(loaded_.layers),
      backend_->Name());

  // Without a rank of its own the worker asks again at every join: dp-ps
  // gives it back the one it had (by worker_id) unless another took it.
  registration_.rank = std::max(rank, 0);
  registration_.any_rank = rank == TrainerOptions::kAnyRank;
  registration_.model_fingerprint = layout.Fingerprint();
  registration_.data = train_.fingerprint;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  registration_.worker_id = absl::StrFormat("%s/%d", host, getpid());

  x_.resize(int64_t{s.batch_size} * layout.input_dim());
  y_.resize(s.batch_size);
  const size_t values = layout.num_params();
  grad_size_ = values;
  wire_ = std::make_unique<LentBufferPool>(
      values * BytesPerValue(loaded_.grad_encoding));
  if (loaded_.grad_encoding != Encoding::kF32) grad_.resize(values);
  return absl::OkStatus();
}

absl::Status Trainer::Join() {
  // The shards can part between the registration and the pull: one that
  // restarted behind a push another took after it (its pull is ABORTED: it
  // lacks the version shard 0 is at). The next registration finds them
  // apart and rolls them back to one step.
  absl::Status pulled;
  for (int round = 0; round < kMaxResyncsInARow; ++round) {
    RETURN_IF_ERROR(Register());
    pulled = PullNewest();
    if (pulled.code() != absl::StatusCode::kAborted) return pulled;
    Log("rank %d: the job moved between its registration and its pull (%s): "
        "registering again",
        rank_, pulled.message());
  }
  return pulled;
}

absl::Status Trainer::Register() {
  ASSIGN_OR_RETURN(const JobStatus joined, client_->Register(registration_));
  RETURN_IF_ERROR(CheckSameJob(loaded_, joined.config));
  rank_ = joined.rank;
  // Asked for again at the next join (a dp-ps restarted knows no process).
  registration_.rank = rank_;
  // Rank 0 evaluates: a worker that dp-ps made rank 0 loads the test set.
  if (rank_ == 0 && !test_.has_value()) {
    ASSIGN_OR_RETURN(const ModelLayout layout, JobMlp(loaded_));
    RETURN_IF_ERROR(LoadTestSet(layout));
  }
  Schedule schedule = joined.config.schedule;
  schedule.num_samples = train_.num_samples;
  const int64_t total = schedule.total_steps();
  const bool first = sampler_ == nullptr;
  if (!first && total != total_) {
    Log("rank %d: the job now has %d steps (was %d)", rank_, total, total_);
  }
  if (first || schedule.epochs != schedule_.epochs ||
      schedule.max_steps != schedule_.max_steps) {
    sampler_ = std::make_unique<BatchSampler>(schedule);
  }
  schedule_ = schedule;
  total_ = total;
  const bool shm = client_->shared_memory();
  if (first || shm != logged_shared_memory_) {
    Log("rank %d: tensors through %s", rank_,
        shm ? (client_->step_channels()
                   ? "shared memory, steps through step channels"
                   : "shared memory, steps by gRPC calls")
            : (client_->why_not_shared_memory().empty()
                   ? std::string("gRPC")
                   : absl::StrCat("gRPC (no shared memory: ",
                                  client_->why_not_shared_memory(), ")")));
    metrics_.SetSharedMemory(shm);
  }
  logged_shared_memory_ = shm;
  gradient_into_slot_ = !client_->GradientSlot().empty();
  return absl::OkStatus();
}

absl::Status Trainer::PullNewest() {
  // The job does not wait for a rank with no block: a version read in
  // place can be overwritten before it is read; the next is. Any other
  // ABORTED (a shard behind, the shards at different versions) is the
  // caller's to mend by joining again.
  absl::Status pulled;
  for (int tries = 0; tries < kMaxResyncsInARow; ++tries) {
    pulled = Timed(metrics_, WorkerMetrics::Call::kPull,
                   [&] { return client_->Pull(rank_, &weights_); });
    if (!IsMovedUnderRead(pulled)) break;
  }
  RETURN_IF_ERROR(pulled);
  metrics_.AddReceivedBytes(weights_.wire_bytes);
  step_ = weights_.step;
  return AdoptWeights();
}

absl::Status Trainer::AdoptWeights() {
  return weights_.in_place ? backend_->ViewWeights(weights_.tensors)
                           : backend_->TakeWeights(&weights_.params);
}

absl::StatusOr<Gradient> Trainer::Compute(const Block& block) {
  const absl::Time start = absl::Now();
  const Encoding encoding = loaded_.grad_encoding;
  // Where the encoded gradient goes: this rank's shared-memory slot (dp-ps
  // has read the last one before it answered), or a buffer no message
  // holds.
  LentBuffer* wire = gradient_into_slot_ ? nullptr : &wire_->Free();
  char* const out =
      gradient_into_slot_ ? client_->GradientSlot().data() : wire->data();
  const absl::Span<float> grad =
      encoding == Encoding::kF32
          ? absl::Span<float>(reinterpret_cast<float*>(out), grad_size_)
          : absl::MakeSpan(grad_);
  // One micro-batch goes straight where it is sent; several are each
  // computed alone (their own matrix products, so that a micro-batch's
  // gradient never depends on what else this worker computed) and summed
  // in the tree's order.
  float loss_sum = 0.0f;
  if (block.count > static_cast<int>(leaves_.size())) {
    leaves_.resize(block.count);
  }
  std::vector<float*> leaves;
  for (int i = 0; i < block.count; ++i) {
    absl::Span<float> into = grad;
    if (block.count > 1) {
      leaves_[i].resize(grad_size_);
      into = absl::MakeSpan(leaves_[i]);
      leaves.push_back(leaves_[i].data());
    }
    GatherBatch(train_, sampler_->Indices(step_, block.first + i), x_.data(),
                y_.data());
    ASSIGN_OR_RETURN(const float loss, backend_->ForwardBackward(x_, y_, into));
    loss_sum += loss;
    ++stats_.gradients;
  }
  if (block.count > 1) SumInTreeOrder(leaves, grad_size_, grad.data());
  if (encoding != Encoding::kF32) {
    Encode(encoding, grad.data(), grad.size(), out);
  }
  const float loss = loss_sum / static_cast<float>(block.count);
  const absl::Duration took = absl::Now() - start;
  metrics_.ObserveCompute(took, loss);
  stats_.compute_seconds += absl::ToDoubleSeconds(took);
  Gradient g;
  g.rank = rank_;
  g.step = step_;
  g.loss = loss;
  g.num_samples = schedule_.batch_size * block.count;
  g.encoding = encoding;
  g.wire = wire;
  g.in_shared_memory = gradient_into_slot_;
  g.block = block;
  return g;
}

absl::Status Trainer::Exchange(const Gradient& gradient) {
  using C = WorkerMetrics::Call;
  bool pushed = false;  // plain protocol: the push was acknowledged
  for (;;) {
    int64_t sent = 0;
    absl::Status s;
    if (options_.fused) {
      s = Timed(metrics_, C::kPushPull,
                [&] { return client_->PushPull(gradient, &weights_, &sent); });
    } else {
      if (!pushed && !gradient.idle) {
        s = Timed(metrics_, C::kPush,
                  [&] { return client_->Push(gradient, &sent); });
        pushed = s.ok();
      }
      Block work;
      if (s.ok()) {
        s = Timed(metrics_, C::kBarrier, [&] {
          return client_->Barrier(rank_, gradient.step, &work);
        });
      }
      if (s.ok() && !work.empty()) {
        weights_.step = gradient.step;
        weights_.block = work;
        weights_.work_only = true;
        return s;
      }
      if (s.ok()) {
        s = Timed(metrics_, C::kPull,
                  [&] { return client_->Pull(rank_, &weights_); });
      }
    }
    metrics_.AddSentBytes(sent);
    stats_.bytes_sent += sent;
    if (s.code() != absl::StatusCode::kDeadlineExceeded) {
      if (s.ok()) {
        metrics_.AddReceivedBytes(weights_.wire_bytes);
        stats_.bytes_received += weights_.wire_bytes;
      }
      return s;
    }
    // The push is recorded (or, if it was lost, sent again with the same
    // bytes: dp-ps acknowledges a repeated push without counting it).
    ++stats_.wait_timeouts;
    metrics_.CountWaitTimeout();
    Log("rank %d: still waiting at step %d for rank(s) %s", rank_,
        gradient.step, MissingRanks());
  }
}

std::string Trainer::MissingRanks() {
  absl::StatusOr<std::vector<int>> missing =
      client_->Unpushed(step_, schedule_.world_size);
  return missing.ok() ? absl::StrJoin(*missing, ",") : "?";
}

absl::Status Trainer::LoadTestSet(const ModelLayout& layout) {
  ASSIGN_OR_RETURN(test_, LoadDataset(loaded_.dataset, options_.data_dir,
                                      loaded_.schedule.seed, Split::kTest));
  if (test_->num_samples == 0) {
    Log("rank 0: no test set (%s and %s are absent): no evaluation",
        test_->features_source, test_->labels_source);
    return absl::OkStatus();
  }
  if (test_->dim != train_.dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the training and test features differ: %s has %d features per "
        "sample, %s has %d",
        train_.features_source, train_.dim, test_->features_source,
        test_->dim));
  }
  return CheckFitsModel(*test_, layout.input_dim(), layout.num_classes());
}

absl::Status Trainer::Evaluate(int64_t finished) {
  EvalReport report;
  report.step = step_;
  report.epoch = schedule_.epoch_of(finished) + 1;
  report.final = step_ == total_;
  // Without a test set only the end is reported (no samples), so that
  // dp-ps does not wait for an evaluation that cannot come.
  if (test_->num_samples == 0) {
    if (!report.final) return absl::OkStatus();
    evaluated_final_ = true;
    if (absl::Status s = client_->ReportEval(rank_, report); !s.ok()) {
      Log("rank 0: end report not accepted: %s", s.message());
    }
    return absl::OkStatus();
  }
  // The test set in chunks gathered from its bytes, not as one float copy.
  const int64_t n = test_->num_samples;
  std::vector<int32_t> rows(std::min<int64_t>(n, kEvalChunk));
  std::vector<float> x(rows.size() * test_->dim);
  std::vector<int32_t> y(rows.size());
  EvalResult eval;
  for (int64_t start = 0; start < n; start += kEvalChunk) {
    const int64_t count = std::min<int64_t>(kEvalChunk, n - start);
    for (int64_t i = 0; i < count; ++i) rows[i] = start + i;
    GatherBatch(*test_, absl::MakeConstSpan(rows.data(), count), x.data(),
                y.data());
    ASSIGN_OR_RETURN(
        const EvalResult chunk,
        backend_->Evaluate(absl::MakeConstSpan(x.data(), count * test_->dim),
                           absl::MakeConstSpan(y.data(), count)));
    eval.correct += chunk.correct;
    eval.loss_sum += chunk.loss_sum;
    eval.count += chunk.count;
  }
  report.accuracy = static_cast<double>(eval.correct) / eval.count;
  report.loss = eval.loss_sum / eval.count;
  report.num_samples = eval.count;
  Log("rank 0: test accuracy %.4f after epoch %d", report.accuracy,
      report.epoch);
  evaluated_final_ = evaluated_final_ || report.final;
  // The number is informative: a refused report must not stop training.
  if (absl::Status s = client_->ReportEval(rank_, report); !s.ok()) {
    Log("rank 0: evaluation report not accepted: %s", s.message());
  }
  return absl::OkStatus();
}

absl::Status Trainer::Step(absl::Time* computed, absl::Status* exchanged) {
  Block block = weights_.block;
  for (;;) {
    Gradient gradient;
    if (block.empty()) {
      gradient.rank = rank_;
      gradient.step = step_;
      gradient.encoding = loaded_.grad_encoding;
      gradient.idle = true;
      *computed = absl::Now();
      *exchanged = Exchange(gradient);
    } else {
      ASSIGN_OR_RETURN(gradient, Compute(block));
      *computed = absl::Now();
      // Weights read in place that changed under the computation
      // (ABORTED) gave a gradient of no version: it is not pushed.
      *exchanged = client_->CheckInPlaceWeights();
      if (exchanged->ok()) *exchanged = Exchange(gradient);
    }
    if (!exchanged->ok() || !weights_.work_only) return absl::OkStatus();
    if (weights_.step != step_) return absl::OkStatus();  // Run re-joins
    block = weights_.block;
    ++stats_.extra_blocks;
  }
}

bool Trainer::NeedsResync(const absl::Status& exchanged) const {
  // ABORTED: stale or future step; FAILED_PRECONDITION: dp-ps restarted
  // and no longer knows this rank.
  return exchanged.code() == absl::StatusCode::kAborted ||
         exchanged.code() == absl::StatusCode::kFailedPrecondition ||
         (exchanged.ok() && (weights_.work_only || weights_.step != step_ + 1));
}

absl::Status Trainer::Resync(const absl::Status& why) {
  // ABORTED, or a version other than the next: the job moved on past this
  // rank's step (another computed its block, a straggler's backup, and the
  // job ran on) or went back (a rollback). dp-ps still knows this rank: the
  // newest version is what any rank that waits gets, and registering again
  // would cost the job a registration per backup. FAILED_PRECONDITION:
  // dp-ps no longer knows it (it restarted).
  absl::Status failed = why;
  if (why.code() != absl::StatusCode::kFailedPrecondition) {
    Log("rank %d: moving on from step %d: %s", rank_, step_,
        why.ok() ? "the answer was a version it did not expect"
                 : why.message());
    ++stats_.catch_ups;
    metrics_.CountCatchUp();
    failed = PullNewest();
    if (failed.ok()) return failed;
  }
  Log("rank %d: re-joining at step %d: %s", rank_, step_, failed.message());
  ++stats_.resyncs;
  metrics_.CountResync();
  return Join();
}

void Trainer::LogSummary() const {
  const double per_step = stats_.steps ? 1.0 / stats_.steps : 0.0;
  Log("rank %d: finished at step %d: %d steps here (%d gradients), %.3f ms "
      "compute + %.3f ms exchange per step, CPU %.3f ms per step, %.3f MB "
      "sent + %.3f MB received "
      "per step, %d re-joins, %d catch-ups, %d barrier timeouts, %d blocks "
      "handed over",
      rank_, step_, stats_.steps, stats_.gradients,
      1e3 * stats_.compute_seconds * per_step,
      1e3 * stats_.exchange_seconds * per_step,
      1e3 * stats_.cpu_seconds * per_step, 1e-6 * stats_.bytes_sent * per_step,
      1e-6 * stats_.bytes_received * per_step, stats_.resyncs, stats_.catch_ups,
      stats_.wait_timeouts, stats_.extra_blocks);
}

absl::Status Trainer::Run() {
  RETURN_IF_ERROR(Load());
  RETURN_IF_ERROR(Join());
  const int rank = rank_;
  if (options_.on_joined) options_.on_joined();
  Log("rank %d: joined at step %d of %d (%d per epoch)", rank, step_, total_,
      schedule_.steps_per_epoch());

  const absl::Duration cpu_at_join = ProcessCpuTime();
  int resyncs_in_a_row = 0;
  while (step_ < total_) {
    if (options_.stop != nullptr && options_.stop->load()) {
      Log("rank %d: stopped at step %d on request", rank, step_);
      return absl::CancelledError(
          absl::StrFormat("stopped at step %d on request", step_));
    }
    const absl::Time start = absl::Now();
    absl::Time computed = start;
    absl::Status exchanged;
    RETURN_IF_ERROR(Step(&computed, &exchanged));
    // dp-ps ended the job: nothing to re-join or retry.
    if (IsJobFailed(exchanged)) return exchanged;
    // In step with the job again, at its step as it is now. A registration
    // refused for good ends the loop.
    if (NeedsResync(exchanged)) {
      if (++resyncs_in_a_row > kMaxResyncsInARow) {
        return absl::AbortedError(absl::StrFormat(
            "rank %d: %d re-syncs in a row without progress; last error: %s",
            rank, resyncs_in_a_row - 1, exchanged.message()));
      }
      RETURN_IF_ERROR(Resync(exchanged));
      continue;
    }
    RETURN_IF_ERROR(exchanged);
    resyncs_in_a_row = 0;
    RETURN_IF_ERROR(AdoptWeights());
    stats_.exchange_seconds += absl::ToDoubleSeconds(absl::Now() - computed);
    metrics_.ObserveStep(absl::Now() - start, schedule_.batch_size);
    ++stats_.steps;
    const int64_t finished = step_;
    step_ = weights_.step;
    if (rank == 0 && schedule_.ends_epoch(finished)) {
      RETURN_IF_ERROR(Evaluate(finished));
    }
  }
  // The job does not wait for rank 0: the others may have applied the last
  // steps while it was away, and it joined at the end. It evaluates the
  // final weights all the same.
  if (rank_ == 0 && !evaluated_final_ && total_ > 0 && step_ == total_) {
    RETURN_IF_ERROR(Evaluate(total_ - 1));
  }
  stats_.cpu_seconds = absl::ToDoubleSeconds(ProcessCpuTime() - cpu_at_join);
  LogSummary();
  return absl::OkStatus();
}

}  // namespace dp
