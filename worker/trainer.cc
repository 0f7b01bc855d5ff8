// Worker loop: pull -> compute -> push -> barrier, with re-sync on ABORTED.
#include "worker/trainer.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/data_order.h"
#include "common/grpc_status.h"
#include "common/dataset.h"
#include "common/log.h"
#include "common/model_layout.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/tensor_message.h"

namespace dp {
namespace {

// A re-sync that does not lead to a completed step, repeated this often,
// means something other than a restart is wrong.
constexpr int kMaxResyncsInARow = 20;

// Copies the rows `indices` of the data set into x (B,dim) and y (B).
void Gather(const Dataset& data, absl::Span<const int32_t> indices,
            std::vector<float>* x, std::vector<int32_t>* y) {
  for (size_t i = 0; i < indices.size(); ++i) {
    const int64_t row = indices[i];
    std::memcpy(x->data() + i * data.dim, data.x.data() + row * data.dim,
                data.dim * sizeof(float));
    (*y)[i] = data.labels[row];
  }
}

// Runs one call to dp-ps and records how long it took.
template <typename Call>
absl::Status Timed(WorkerMetrics& metrics, WorkerMetrics::Call what,
                   Call call) {
  const absl::Time start = absl::Now();
  absl::Status s = call();
  metrics.ObserveCall(what, absl::Now() - start);
  return s;
}

}  // namespace

Trainer::Trainer(PsClient* client, TrainerOptions options)
    : client_(client), options_(std::move(options)) {}

absl::Status Trainer::Run() {
  const int rank = options_.rank;
  WorkerMetrics unexported(rank);
  WorkerMetrics& metrics = options_.metrics ? *options_.metrics : unexported;
  // The job's configuration lives in dp-ps: ask before loading any data.
  ASSIGN_OR_RETURN(dp::v1::GetStatusResponse job, client_->GetStatus());
  const dp::v1::JobConfig& cfg = job.config();
  if (rank < 0 || rank >= cfg.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d is out of range: the job has %d workers", rank,
                        cfg.world_size()));
  }
  ASSIGN_OR_RETURN(Dataset train, LoadDataset(cfg.dataset(), options_.data_dir,
                                              cfg.seed(), Split::kTrain));
  std::optional<Dataset> test;
  if (rank == 0) {
    ASSIGN_OR_RETURN(test, LoadDataset(cfg.dataset(), options_.data_dir,
                                       cfg.seed(), Split::kTest));
  }
  const ModelLayout layout = ModelLayout::SimpleNet();
  BackendOptions backend_options;
  backend_options.max_batch = std::max(cfg.batch_size(), 1000);
  backend_options.cpu_threads = options_.cpu_threads;
  backend_options.tf32 = options_.tf32;
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   options_.backend.Create(layout, backend_options));
  Log("rank %d: %d training samples of %s, backend %s", rank, train.num_samples,
      cfg.dataset(), backend->Name());

  dp::v1::RegisterRequest reg_request;
  reg_request.set_rank(rank);
  reg_request.set_model_fingerprint(layout.Fingerprint());
  reg_request.mutable_data()->set_num_samples(train.fingerprint.num_samples);
  reg_request.mutable_data()->set_hash(train.fingerprint.hash);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  reg_request.set_worker_id(absl::StrFormat("%s/%d", host, getpid()));

  Schedule schedule;
  int64_t step = 0;
  PsClient::Weights weights;
  // (Re-)joins the job: registers, learns its step, pulls the weights of
  // that version. The data position follows from the step alone.
  auto sync = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(dp::v1::RegisterResponse reg,
                     client_->Register(reg_request));
    const dp::v1::JobConfig& c = reg.config();
    schedule.num_samples = train.num_samples;
    schedule.world_size = c.world_size();
    schedule.batch_size = c.batch_size();
    schedule.epochs = c.epochs();
    schedule.max_steps = c.max_steps();
    schedule.seed = c.seed();
    schedule.shuffle = c.shuffle();
    RETURN_IF_ERROR(Timed(metrics, WorkerMetrics::Call::kPull,
                          [&] { return client_->Pull(rank, &weights); }));
    metrics.AddReceivedBytes(weights.wire_bytes);
    step = weights.header.step();
    return backend->TakeWeights(&weights.params);
  };
  RETURN_IF_ERROR(sync());
  BatchSampler sampler(schedule);
  const int64_t total = schedule.total_steps();
  if (options_.on_joined) options_.on_joined();
  Log("rank %d: joined at step %d of %d (%d per epoch)", rank, step, total,
      schedule.steps_per_epoch());

  std::vector<float> x(int64_t{schedule.batch_size} * layout.input_dim());
  std::vector<int32_t> y(schedule.batch_size);
  dp::v1::PushRequest push;
  push.set_rank(rank);
  push.set_num_samples(schedule.batch_size);
  const Encoding encoding = static_cast<Encoding>(cfg.grad_encoding());
  push.set_encoding(cfg.grad_encoding());
  // The gradient as it goes on the wire; gRPC sends it from this buffer.
  // For float32 the backend writes straight into it.
  const size_t wire_size = layout.num_params() * BytesPerValue(encoding);
  std::shared_ptr<std::vector<char>> wire;
  std::vector<float> grad_f32(encoding == Encoding::kF32 ? 0
                                                         : layout.num_params());
  absl::Span<float> grad = absl::MakeSpan(grad_f32);

  int resyncs_in_a_row = 0;
  while (step < total) {
    if (options_.stop != nullptr && options_.stop->load()) {
      Log("rank %d: stopped at step %d on request", rank, step);
      return absl::CancelledError(
          absl::StrFormat("stopped at step %d on request", step));
    }
    const absl::Time t0 = absl::Now();
    // A buffer gRPC still references (a message not yet released) is never
    // written: the step gets a fresh one, and the old one lives on until
    // gRPC lets go of it.
    if (wire == nullptr || wire.use_count() > 1) {
      wire = std::make_shared<std::vector<char>>(wire_size);
      if (encoding == Encoding::kF32) {
        grad = absl::Span<float>(reinterpret_cast<float*>(wire->data()),
                                 layout.num_params());
      }
    }
    Gather(train, sampler.Indices(step, rank), &x, &y);
    ASSIGN_OR_RETURN(float loss, backend->ForwardBackward(x, y, grad));
    if (encoding != Encoding::kF32) {
      Encode(encoding, grad.data(), grad.size(), wire->data());
    }
    const absl::Time t1 = absl::Now();
    metrics.ObserveCompute(t1 - t0, loss);
    push.set_step(step);
    push.set_loss(loss);
    const grpc::ByteBuffer request = SerializeWithTensor(
        push, dp::v1::PushRequest::kGradientFieldNumber,
        absl::string_view(wire->data(), wire->size()), wire);
    absl::Status exchanged;
    using C = WorkerMetrics::Call;
    if (options_.fused) {
      exchanged = Timed(metrics, C::kPushPull,
                        [&] { return client_->PushPull(request, &weights); });
    } else {
      exchanged = Timed(metrics, C::kPush,
                        [&] { return client_->Push(request).status(); });
      if (exchanged.ok()) {
        exchanged = Timed(metrics, C::kBarrier, [&] {
          return client_->Barrier(rank, step).status();
        });
      }
      if (exchanged.ok()) {
        exchanged = Timed(metrics, C::kPull,
                          [&] { return client_->Pull(rank, &weights); });
      }
    }
    metrics.AddSentBytes(request.Length());
    if (exchanged.ok()) metrics.AddReceivedBytes(weights.wire_bytes);
    if (exchanged.code() == absl::StatusCode::kDeadlineExceeded) {
      auto st = client_->GetStatus();
      std::vector<int> missing;
      if (st.ok()) {
        std::vector<bool> pushed(cfg.world_size(), false);
        for (int r : st->pushed_ranks()) pushed[r] = true;
        for (int r = 0; r < cfg.world_size(); ++r) {
          if (!pushed[r]) missing.push_back(r);
        }
      }
      Log("rank %d: still waiting at step %d for rank(s) %s", rank, step,
          absl::StrJoin(missing, ","));
      continue;  // the push is recorded; a retry is acknowledged, not counted
    }
    // dp-ps ended the job: nothing to re-sync with or retry.
    if (IsJobFailed(exchanged)) return exchanged;
    // ABORTED: stale or future step; FAILED_PRECONDITION: dp-ps restarted
    // and no longer knows this rank. Both: register again and continue from
    // the step dp-ps is at. A registration refused for good ends the loop.
    if (exchanged.code() == absl::StatusCode::kAborted ||
        exchanged.code() == absl::StatusCode::kFailedPrecondition ||
        (exchanged.ok() && weights.header.step() != step + 1)) {
      Log("rank %d: re-syncing at step %d: %s", rank, step,
          exchanged.ok() ? "unexpected version" : exchanged.message());
      if (++resyncs_in_a_row > kMaxResyncsInARow) {
        return absl::AbortedError(absl::StrFormat(
            "rank %d: %d re-syncs in a row without progress; last error: %s",
            rank, resyncs_in_a_row - 1, exchanged.message()));
      }
      ++stats_.resyncs;
      metrics.CountResync();
      RETURN_IF_ERROR(sync());
      continue;
    }
    resyncs_in_a_row = 0;
    RETURN_IF_ERROR(exchanged);
    RETURN_IF_ERROR(backend->TakeWeights(&weights.params));
    stats_.compute_seconds += absl::ToDoubleSeconds(t1 - t0);
    stats_.exchange_seconds += absl::ToDoubleSeconds(absl::Now() - t1);
    stats_.bytes_sent += request.Length();
    stats_.bytes_received += weights.wire_bytes;
    metrics.ObserveStep(absl::Now() - t0, schedule.batch_size);
    ++stats_.steps;
    const int64_t finished = step;
    step = weights.header.step();
    if (rank == 0 && schedule.ends_epoch(finished)) {
      ASSIGN_OR_RETURN(EvalResult eval,
                       backend->Evaluate(test->x, test->labels));
      dp::v1::ReportEvalRequest report;
      report.set_rank(rank);
      report.set_step(step);
      report.set_epoch(
          static_cast<int>((step - 1) / schedule.steps_per_epoch()) + 1);
      report.set_accuracy(static_cast<double>(eval.correct) / eval.count);
      report.set_loss(eval.loss_sum / eval.count);
      report.set_num_samples(eval.count);
      report.set_final(step == total);
      Log("rank 0: test accuracy %.4f after epoch %d", report.accuracy(),
          report.epoch());
      // The number is informative: a refused report must not stop training.
      if (absl::Status s = client_->ReportEval(report); !s.ok()) {
        Log("rank 0: evaluation report not accepted: %s", s.message());
      }
    }
  }
  const double per_step = stats_.steps ? 1.0 / stats_.steps : 0.0;
  Log("rank %d: finished at step %d: %d steps here, %.3f ms compute + %.3f "
      "ms exchange per step, %.3f MB sent + %.3f MB received per step, %d "
      "re-syncs",
      rank, step, stats_.steps, 1e3 * stats_.compute_seconds * per_step,
      1e3 * stats_.exchange_seconds * per_step,
      1e-6 * stats_.bytes_sent * per_step,
      1e-6 * stats_.bytes_received * per_step, stats_.resyncs);
  return absl::OkStatus();
}

}  // namespace dp
