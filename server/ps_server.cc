// dp-ps's lifecycle (see ps_server.h); the logic server_main.cc once held.
#include "server/ps_server.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/cpu_quota.h"
#include "common/job_failure.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "proto/grpc_server.h"
#include "server/ps_service.h"

namespace dp {
namespace {

// How long a failed job goes on answering with its failure, at most, for
// the workers that were computing when it failed.
constexpr absl::Duration kFailureGrace = absl::Seconds(5);

// The coordinator's state as the metrics mirror it at scrape time.
ServerMetrics::Progress ProgressOf(const CoordinatorStatus& s) {
  ServerMetrics::Progress p;
  p.step = s.step;
  p.planned_steps = s.total_steps;
  if (s.total_steps > 0) {
    p.epoch =
        s.config.schedule.epoch_of(std::min(s.step, s.total_steps - 1)) + 1;
  }
  p.has_loss = s.step > 0;
  p.loss = s.last_loss;
  p.has_eval = s.has_eval;
  p.test_accuracy = s.last_eval.accuracy;
  p.test_loss = s.last_eval.loss;
  p.registered_workers = static_cast<int>(s.registered_ranks.size());
  p.failed = s.failed;
  return p;
}

// The options' model. They come checked (ServerOptionsFromFlags, or a
// test's own), so a model that is none is a bug.
ModelLayout LayoutOfOptions(const PsServerOptions& o) {
  absl::StatusOr<ModelLayout> layout = LayoutOfJob(o.config, "the model");
  if (!layout.ok()) {
    Log("fatal: %s", layout.status().message());
    std::abort();
  }
  return *std::move(layout);
}

// INVALID_ARGUMENT naming the tensor and index of the first value that is
// NaN or infinite: Adam would carry it into every weight it touches.
absl::Status CheckFinite(const ModelLayout& layout,
                         const std::vector<float>& params) {
  for (const TensorInfo& t : layout.tensors()) {
    for (int64_t i = 0; i < t.size; ++i) {
      if (!std::isfinite(params[t.offset + i])) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensor \"%s\" holds %g at index %d: the weights must be finite",
            t.name, params[t.offset + i], i));
      }
    }
  }
  return absl::OkStatus();
}

// `s` with `file` before its message.
absl::Status Naming(const std::string& file, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(file, ": ", s.message()));
}

// --save_model with "{step}" replaced by the weights' step.
std::string ModelPath(const std::string& pattern, int64_t step) {
  return absl::StrReplaceAll(pattern, {{"{step}", absl::StrCat(step)}});
}

}  // namespace

int DefaultUpdateThreads(int64_t values, int usable_cpus) {
  const int64_t worth =
      (values + kValuesPerUpdateThread - 1) / kValuesPerUpdateThread;
  return static_cast<int>(std::clamp<int64_t>(
      std::min<int64_t>(usable_cpus, worth), 1, kMaxUpdateThreads));
}

PsServer::PsServer(PsServerOptions options)
    : options_(std::move(options)), layout_(LayoutOfOptions(options_)) {}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(
    PsServerOptions options) {
  std::unique_ptr<PsServer> server(new PsServer(std::move(options)));
  RETURN_IF_ERROR(server->Build());
  RETURN_IF_ERROR(server->Serve());
  return server;
}

absl::StatusOr<TrainingState> PsServer::InitialState() const {
  std::vector<float> params;
  if (!options_.init_model.empty()) {
    absl::StatusOr<std::vector<float>> loaded =
        LoadSafetensors(options_.init_model, layout_);
    // LoadSafetensors' errors name the file; CheckFinite's do not.
    absl::Status s =
        loaded.ok() ? Naming(options_.init_model, CheckFinite(layout_, *loaded))
                    : loaded.status();
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("--init_model: ", s.message()));
    }
    params = *std::move(loaded);
  } else if (!layout_.is_mlp()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model (", layout_.Describe(),
                     ") is not an MLP: its weights come from --init_model"));
  } else {
    params = InitParams(layout_, options_.config.schedule.seed);
  }
  TrainingState state;
  const ParamRange r = shard_.range;
  state.params.assign(params.begin() + r.offset, params.begin() + r.end());
  state.m.assign(r.length, 0.0f);
  state.v.assign(r.length, 0.0f);
  return state;
}

absl::Status PsServer::Build() {
  const PsServerOptions& o = options_;
  RETURN_IF_ERROR(MakeShardSpec(layout_, o.shards, o.shard, &shard_));
  if (sharded()) {
    Log("%s: %d of %d parameters", shard_.ToString(), shard_.range.length,
        layout_.num_params());
  }
  RETURN_IF_ERROR(CheckShardAddresses(shard_.count, shard_.index,
                                      o.gather.addresses.size()));
  ASSIGN_OR_RETURN(std::optional<Checkpoint> resumed, OpenCheckpoints());
  RETURN_IF_ERROR(MakeCoordinator(std::move(resumed)));
  ElasticOptions elastic = o.elastic;
  // The lease that frees a silent rank for another process is the one that
  // makes it missing.
  elastic.lease = o.worker_timeout;
  coordinator_->SetElastic(elastic);
  StartSharedPlane();
  service_ = std::make_unique<PsService>(coordinator_.get(), metrics_.get(),
                                         ServiceOptions());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Checkpoint>> PsServer::OpenCheckpoints() {
  const PsServerOptions& o = options_;
  if (o.checkpoint_dir.empty()) return std::nullopt;
  store_ = std::make_unique<CheckpointStore>(o.checkpoint_dir, layout_,
                                             o.keep_checkpoints, shard_.index,
                                             shard_.count);
  RETURN_IF_ERROR(store_->Open());
  RETURN_IF_ERROR(store_->CheckSameModel());
  std::optional<Checkpoint> resumed = store_->LoadNewest();
  if (!resumed.has_value()) return std::nullopt;
  // The job's length in steps (a cosine schedule's T) needs the data set's.
  JobConfig saved = resumed->config;
  JobConfig wanted = o.config;
  if (resumed->data.has_value()) {
    saved.schedule.num_samples = resumed->data->num_samples;
    wanted.schedule.num_samples = resumed->data->num_samples;
  }
  if (absl::Status s =
          CheckResumable(saved, wanted, o.allow_hyperparameter_change);
      !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat(o.checkpoint_dir, ": ", s.message()));
  }
  if (const std::vector<std::string> changes =
          HyperparameterChanges(saved, wanted);
      !changes.empty()) {
    Log("--allow_hyperparameter_change: the updates from step %d on use "
        "other optimiser settings than the checkpoint's: %s",
        resumed->state.step, absl::StrJoin(changes, ", "));
  }
  if (resumed->shard_index != shard_.index ||
      resumed->shard_count != shard_.count) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: the checkpoint of step %d holds shard %d of %d; this dp-ps "
        "is shard %d of %d (--shard, --shards)",
        o.checkpoint_dir, resumed->state.step, resumed->shard_index,
        resumed->shard_count, shard_.index, shard_.count));
  }
  return resumed;
}

absl::Status PsServer::MakeCoordinator(std::optional<Checkpoint> resumed) {
  const PsServerOptions& o = options_;
  TrainingState state;
  if (resumed.has_value()) {
    state = resumed->state;
    Log("resuming from the checkpoint of step %d in %s", state.step,
        o.checkpoint_dir);
  } else {
    ASSIGN_OR_RETURN(state, InitialState());
    if (!o.init_model.empty()) Log("initial weights from %s", o.init_model);
  }
  metrics_ = std::make_unique<ServerMetrics>(
      o.config.schedule.world_size, shard_.index, o.config.min_workers);
  const int threads =
      o.update_threads > 0
          ? o.update_threads
          : DefaultUpdateThreads(shard_.range.length, UsableCpus());
  coordinator_ = std::make_unique<StepCoordinator>(
      layout_, o.config, std::move(state), threads, shard_);
  Log("the update runs on %d thread%s", threads, threads == 1 ? "" : "s");
  coordinator_->SetUpdateObserver(
      [m = metrics_.get()](absl::Duration d) { m->ObserveUpdate(d); });
  if (resumed.has_value() && resumed->data.has_value()) {
    if (absl::Status s = coordinator_->RestoreData(*resumed->data); !s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("checkpoint in ", o.checkpoint_dir, ": ", s.message()));
    }
  }
  if (store_ != nullptr && o.checkpoint_every > 0) {
    coordinator_->AddStepHook(o.checkpoint_every, [this](TrainingState s,
                                                         uint64_t generation) {
      store_->WriteAsync(Checkpoint{options_.config, coordinator_->data(),
                                    std::move(s), shard_.index, shard_.count},
                         generation);
    });
  }
  if (o.save_model_every > 0) {
    coordinator_->AddStepHook(
        o.save_model_every,
        [this](TrainingState s, uint64_t) { SaveModelOf(s.step, s.params); });
  }
  return absl::OkStatus();
}

void PsServer::StartSharedPlane() {
  const PsServerOptions& o = options_;
  if (!o.shared_memory) return;
  absl::StatusOr<std::unique_ptr<SharedPlane>> shared =
      SharedPlane::Start(o.config.schedule.world_size, shard_.range.length,
                         o.config.grad_encoding, o.config.weight_encoding);
  if (shared.ok()) {
    shared_ = *std::move(shared);
  } else {  // workers use gRPC
    Log("no shared memory for workers: %s", shared.status().message());
  }
}

PsServiceOptions PsServer::ServiceOptions() {
  PsServiceOptions service_options{options_.security.auth_token, shared_.get(),
                                   options_.step_spin};
  if (!sharded()) return service_options;
  if (store_ != nullptr) {
    service_options.restorable_steps = [this] {
      return store_->RestorableSteps();
    };
    // Before the answer, so before any step of the new history.
    service_options.on_rewound = [this](int64_t step, uint64_t generation) {
      store_->Rewind(step, generation);
    };
  }
  service_options.restore =
      [this](int64_t step) -> absl::StatusOr<TrainingState> {
    if (step == 0) return InitialState();
    if (store_ == nullptr) {
      return absl::FailedPreconditionError("no --checkpoint_dir");
    }
    ASSIGN_OR_RETURN(Checkpoint c, store_->Load(step));
    return std::move(c.state);
  };
  service_options.on_weights_collected = [this](int64_t step) {
    NoteCollected(step);
  };
  return service_options;
}

absl::Status PsServer::Serve() {
  const PsServerOptions& o = options_;
  if (o.metrics_port != kMetricsOff) {
    ASSIGN_OR_RETURN(metrics_endpoint_,
                     metrics_->Serve(o.metrics_host, o.metrics_port, [this] {
                       const CoordinatorStatus status = coordinator_->Status();
                       metrics_->SetProgress(ProgressOf(status));
                       metrics_->SetElasticity(ElasticityOf(status));
                       if (store_ != nullptr) {
                         metrics_->SetCheckpoints({options_.checkpoint_every,
                                                   store_->NewestStep(),
                                                   store_->failures()});
                       }
                     }));
    Log("metrics on %s:%d", o.metrics_host, metrics_endpoint_->port());
  }
  GrpcServerOptions grpc_options;
  grpc_options.credentials = o.security.credentials;
  grpc_options.address = absl::StrFormat("%s:%d", o.host, o.port);
  grpc_options.max_message_bytes = MessageBytesFor(layout_.num_params());
  ASSIGN_OR_RETURN(RunningServer running,
                   StartGrpcServer(grpc_options, {service_.get()}));
  server_ = std::move(running.server);
  port_ = running.port;
  // With TLS on --port, the kubelet's probes use this plaintext port.
  if (o.health_port >= 0) {
    ASSIGN_OR_RETURN(health_, HealthServer::Start(o.host, o.health_port));
    Log("health service on port %d", health_->port());
  }
  SetReady(true);
  Log("listening on %s:%d for %d workers", o.host, port_,
      o.config.schedule.world_size);
  return absl::OkStatus();
}

void PsServer::SetReady(bool ready) {
  const std::vector<std::string> services = {PsService::kServiceName};
  dp::SetReady(server_.get(), ready, services);
  if (health_ != nullptr) health_->SetReady(ready, services);
}

void PsServer::Stop(int signal) {
  int expected = 0;
  if (!stop_signal_.compare_exchange_strong(expected, signal)) return;
  // Readiness first, so that probes see the drain before requests fail.
  SetReady(false);
  coordinator_->Shutdown();  // refuses steps; wakes Watch
  stopped_.Notify();
}

absl::Status PsServer::FinalCheckpoint() {
  if (store_ == nullptr) return absl::OkStatus();
  store_->Flush();
  TrainingState s = coordinator_->Snapshot();
  const int64_t step = s.step;
  absl::Status written =
      store_->Write(Checkpoint{options_.config, coordinator_->data(),
                               std::move(s), shard_.index, shard_.count});
  if (written.ok()) {
    Log("checkpoint of step %d written to %s", step, options_.checkpoint_dir);
  } else {
    Log("error: %s", written.message());
  }
  return written;
}

absl::Status PsServer::Watch() {
  const absl::Time start = absl::Now();
  absl::Time last_print = start;
  int64_t last_step = -1;
  while (!coordinator_->AwaitDone(absl::Milliseconds(100))) {
    if (stop_signal_.load() != 0) return absl::OkStatus();
    for (const auto& e : coordinator_->CheckLeases(options_.worker_timeout)) {
      const double secs = absl::ToDoubleSeconds(e.silent);
      if (e.kind == StepCoordinator::LeaseEvent::kNeverRegistered) {
        Log("rank %d has not registered yet (%.1f s since start)", e.rank,
            secs);
        continue;
      }
      if (e.kind == StepCoordinator::LeaseEvent::kBack) {
        Log("rank %d is back after %.1f s", e.rank, secs);
        continue;
      }
      const std::string why = e.closed
                                  ? "its connection closed"
                                  : absl::StrFormat("no call for %.1f s", secs);
      const OnWorkerLoss policy = options_.elastic.on_worker_loss;
      if (policy == OnWorkerLoss::kFail) {
        return JobFailedError(absl::StrFormat(
            "rank %d was lost (%s, --on_worker_loss=fail)", e.rank, why));
      } else if (policy == OnWorkerLoss::kWait) {
        Log("rank %d is missing: %s; step %d waits for it "
            "(--on_worker_loss=wait)",
            e.rank, why, coordinator_->Status().step);
      } else {
        const CoordinatorStatus s = coordinator_->Status();
        const int live = static_cast<int>(s.live_ranks.size());
        const int min_workers = s.config.live_minimum();
        if (live >= min_workers) {
          Log("rank %d is missing: %s; its block of step %d goes to the "
              "others (--on_worker_loss=reassign)",
              e.rank, why, s.step);
        } else {
          Log("rank %d is missing: %s; step %d waits: %d live, fewer than "
              "--min_workers=%d",
              e.rank, why, s.step, live, min_workers);
        }
      }
    }
    const absl::Time now = absl::Now();
    if (now - last_print < absl::Seconds(1)) continue;
    const CoordinatorStatus s = coordinator_->Status();
    if (s.total_steps == 0 || s.step == last_step) continue;
    const double rate =
        last_step < 0
            ? 0.0
            : (s.step - last_step) / absl::ToDoubleSeconds(now - last_print);
    const double samples_per_s = rate * s.config.schedule.global_batch();
    const double eta = rate > 0 ? (s.total_steps - s.step) / rate : 0.0;
    Log("epoch %d/%d  step %d/%d  loss %.4f  %.0f samples/s  ETA %.0fs",
        s.config.schedule.epoch_of(std::min(s.step, s.total_steps - 1)) + 1,
        s.config.schedule.epochs, s.step, s.total_steps, s.last_loss,
        samples_per_s, eta);
    last_step = s.step;
    last_print = now;
  }
  return absl::OkStatus();
}

absl::Status PsServer::Finish(absl::Time start) {
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  (void)FinalCheckpoint();  // logged; the model file below is the result
  if (sharded() && shard_.index != 0) {
    AwaitCollection();
  } else {
    RETURN_IF_ERROR(SaveModel());
  }
  // Rolled back meanwhile: Run trains on, and this step is not the end.
  if (!coordinator_->done()) return absl::OkStatus();
  // One --final_eval_timeout_s for the evaluation and the workers' going,
  // as the other shards wait one for both.
  const absl::Time deadline = absl::Now() + options_.final_eval_timeout;
  // Rank 0 reports its evaluations to shard 0 only.
  const bool have_eval = shard_.index == 0 && coordinator_->AwaitFinalEval(
                                                  options_.final_eval_timeout);
  if (shard_.index == 0) AwaitWorkersGone(deadline);
  LogSummary(seconds, have_eval);
  return absl::OkStatus();
}

void PsServer::AwaitWorkersGone(absl::Time deadline) {
  // A worker whose last block another computed may still be pushing it;
  // and rank 0 pulls the final weights from every shard.
  const std::vector<int> held =
      coordinator_->AwaitRanksGone(deadline - absl::Now());
  if (!held.empty()) {
    Log("rank(s) %s still connected %.0f s after the end; going all the same",
        absl::StrJoin(held, ","),
        absl::ToDoubleSeconds(options_.final_eval_timeout));
  }
  if (sharded()) {
    ReleaseShards(options_.gather, layout_.num_params(),
                  coordinator_->Status().step);
  }
}

void PsServer::NoteCollected(int64_t step) {
  const CoordinatorStatus s = coordinator_->Status();
  if (!coordinator_->done() || step != s.step) return;
  absl::MutexLock lock(&collection_mu_);
  collected_generation_ = s.generation;
}

void PsServer::AwaitCollection() {
  const absl::Time deadline = absl::Now() + options_.final_eval_timeout;
  const uint64_t generation = coordinator_->Status().generation;
  auto collected = [this, generation]()
                       ABSL_SHARED_LOCKS_REQUIRED(collection_mu_) {
                         return collected_generation_ == generation;
                       };
  // Woken every 100 ms to see a rollback or a stop: then the end of this
  // history is not the job's, and Run decides what comes next.
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&collection_mu_);
      if (collection_mu_.AwaitWithTimeout(absl::Condition(&collected),
                                          absl::Milliseconds(100))) {
        Log("shard 0 collected this shard's final weights");
        return;
      }
    }
    if (!coordinator_->done() || stop_signal_.load() != 0) return;
  }
  Log("shard 0 did not collect this shard's final weights within %.0f s",
      absl::ToDoubleSeconds(options_.final_eval_timeout));
}

void PsServer::SaveModelOf(int64_t step, const std::vector<float>& params) {
  // Hooks of two steps may run at once, on two threads: one write at a
  // time, and never an older model over a newer one.
  absl::MutexLock lock(&model_mu_);
  if (step <= model_saved_step_) return;
  const std::string path = ModelPath(options_.save_model, step);
  if (absl::Status s = SaveSafetensors(path, layout_, params); !s.ok()) {
    Log("cannot save the model of step %d (training goes on): %s", step,
        s.message());
    return;
  }
  model_saved_step_ = step;
  Log("saved the model of step %d to %s", step, path);
}

absl::Status PsServer::SaveModel() {
  absl::StatusOr<std::vector<float>> weights = FinalWeights();
  // Cut short by a rollback (Run trains on) or a stop (Run drains).
  if (weights.status().code() == absl::StatusCode::kCancelled &&
      (!coordinator_->done() || stop_signal_.load() != 0)) {
    Log("%s", weights.status().message());
    return stop_signal_.load() != 0 ? weights.status() : absl::OkStatus();
  }
  RETURN_IF_ERROR(weights.status());
  if (options_.save_model.empty()) return absl::OkStatus();
  absl::MutexLock lock(&model_mu_);
  const std::string path =
      ModelPath(options_.save_model, coordinator_->Status().step);
  if (absl::Status s = SaveSafetensors(path, layout_, *weights); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("cannot save the model: ", s.message()));
  }
  Log("saved the model to %s", path);
  return absl::OkStatus();
}

void PsServer::LogSummary(double seconds, bool have_eval) const {
  const CoordinatorStatus s = coordinator_->Status();
  const StepTimes& t = s.times;
  // The training rate, from the first update to the last.
  const double train_seconds =
      absl::ToDoubleSeconds(t.last_apply - t.first_apply);
  const double rate = train_seconds > 0
                          ? (s.step - t.first_applied_step) *
                                double(s.config.schedule.global_batch()) /
                                train_seconds
                          : 0.0;
  Log("done: %d steps in %.1f s, %.0f samples/s while training, final loss "
      "%.4f",
      s.step, seconds, rate, s.last_loss);
  if (t.applies > 0) {
    std::string waits;
    for (size_t r = 0; r < t.wait_time.size(); ++r) {
      absl::StrAppendFormat(
          &waits, " rank %d %.3f ms", r,
          absl::ToDoubleMilliseconds(t.wait_time[r]) / t.applies);
    }
    const double per_step = 1.0 / t.applies;
    // Between the first update and the last: training, not start-up.
    const double cpu_per_step =
        t.applies > 1
            ? absl::ToDoubleMilliseconds(t.last_apply_cpu - t.first_apply_cpu) /
                  (t.applies - 1)
            : 0.0;
    Log("per step: update %.3f ms, reading pushes %.3f ms, into shared "
        "memory %.3f ms, dp-ps CPU %.3f ms; from push to published update:%s",
        absl::ToDoubleMilliseconds(t.apply_time) * per_step,
        absl::ToDoubleMilliseconds(t.read_time) * per_step,
        absl::ToDoubleMilliseconds(t.use_time) * per_step, cpu_per_step, waits);
  }
  if (shard_.index == 0) {
    const ElasticCounts& e = s.elastic;
    Log("elastic: %d micro-batches a step; %d blocks of lost workers "
        "reassigned, %d late blocks backed up, %d duplicate pushes",
        s.micro_batches, e.blocks_reassigned, e.backups_handed,
        e.duplicate_pushes);
  }
  if (have_eval && s.last_eval.num_samples == 0) {
    Log("no final test accuracy: rank 0 has no test set");
  } else if (have_eval) {
    Log("final test accuracy: %.4f", s.last_eval.accuracy);
  } else if (shard_.index == 0) {
    Log("no final test accuracy from rank 0 within %.0f s",
        absl::ToDoubleSeconds(options_.final_eval_timeout));
  }
}

absl::StatusOr<std::vector<float>> PsServer::FinalWeights() {
  const TrainingState own = coordinator_->Snapshot();
  if (!sharded()) return own.params;
  GatherOptions gather = options_.gather;
  gather.timeout = options_.final_eval_timeout;
  gather.keep_going = [this] {
    return coordinator_->done() && stop_signal_.load() == 0;
  };
  absl::StatusOr<std::vector<float>> all = GatherShards(
      gather, layout_, shard_.count, own.step, shard_.index, own.params);
  if (!all.ok()) {
    return absl::Status(
        all.status().code(),
        absl::StrCat("cannot collect the model: ", all.status().message()));
  }
  Log("collected the weights of step %d from %d shards", own.step,
      shard_.count);
  return all;
}

absl::StatusOr<PsServer::Outcome> PsServer::Run() {
  const absl::Time start = absl::Now();
  absl::Status finished;
  for (;;) {
    if (absl::Status failure = Watch(); !failure.ok()) {
      Log("error: %s", failure.message());
      coordinator_->Fail(failure);
      (void)FinalCheckpoint();  // logged; the failure is the result
      // A worker computing a block when the job failed is told at its
      // next call, not met by a closed port that it would retry; through
      // a step channel, the telling is written just after it counts.
      const absl::Time told_by = absl::Now() + kFailureGrace;
      coordinator_->AwaitFailureTold(kFailureGrace);
      if (shared_ != nullptr) {
        shared_->AwaitStepsAnswered(told_by - absl::Now());
      }
      // The failure (dp_training_failed) reaches a Prometheus that scrapes
      // dp-ps before it exits, as the end of a finished job does.
      if (metrics_endpoint_) metrics_->AwaitNextScrape(absl::Seconds(30));
      // Serve the failure to workers already in a call before going away.
      ShutdownServers(absl::Seconds(3));
      return failure;
    }
    if (const int sig = stop_signal_.load();
        sig != 0 && !coordinator_->done()) {
      Log("stopped by signal %d at step %d; draining", sig,
          coordinator_->Status().step);
      const absl::Status written = FinalCheckpoint();
      ShutdownServers(absl::Seconds(2));
      if (!written.ok()) return written;
      return Outcome::kStopped;
    }
    finished = Finish(start);
    if (finished.code() == absl::StatusCode::kCancelled &&
        stop_signal_.load() != 0) {
      // Stopped while collecting the model: the final checkpoint is
      // written, and a restart collects it again.
      ShutdownServers(absl::Seconds(2));
      return Outcome::kStopped;
    }
    // A shard that finished can still be rolled back, when another shard
    // restarts from an older checkpoint before the end: it trains on.
    if (!finished.ok() || coordinator_->done() || stop_signal_.load() != 0) {
      break;
    }
    Log("rolled back to step %d after the end; training on",
        coordinator_->Status().step);
  }
  if (finished.ok() && options_.exit_when_done && metrics_endpoint_) {
    // How the job ended (its last step, the final accuracy) reaches a
    // Prometheus that scrapes dp-ps before it exits; 30 s at most.
    metrics_->AwaitNextScrape(absl::Seconds(30));
  }
  if (finished.ok() && !options_.exit_when_done) {
    Log("serving the final weights and status until SIGTERM");
    stopped_.WaitForNotification();
  }
  coordinator_->Shutdown();
  ShutdownServers(absl::Seconds(2));
  if (!finished.ok()) return finished;
  return Outcome::kFinished;
}

// Shuts down, but keeps the objects: Stop may still set their readiness
// from another thread (which then changes nothing) until ~PsServer.
void PsServer::ShutdownServers(absl::Duration grace) {
  if (server_ != nullptr) {
    if (service_ != nullptr) service_->EndAttendance();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  }
  if (health_ != nullptr) health_->Shutdown(grace);
}

PsServer::~PsServer() {
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  ShutdownServers(absl::Seconds(2));
  // Servers first: nothing reads the parts below once they are gone.
  server_.reset();
  metrics_endpoint_.reset();
}

}  // namespace dp
