// dp-ps: parses flags, builds the parameter store and serves it until every
// step is applied, then saves the model and exits 0.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/dataset.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/metrics.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "common/tensor_codec.h"
#include "common/security.h"
#include "server/checkpoint.h"
#include "server/health_server.h"
#include "server/ps_service.h"
#include "server/step_coordinator.h"

namespace dp {
namespace {

struct ServerFlags {
  std::string host = "0.0.0.0";
  int port = 5000;
  int health_port = -1;
  int metrics_port = 0;
  std::string metrics_host = "0.0.0.0";
  int workers = 2;
  int batch_size = 64;
  int epochs = 3;
  double lr = 1e-3;
  int64_t seed = 0;
  bool shuffle = true;
  std::string dataset = "fashion-mnist";
  int64_t max_steps = 0;
  std::string init_model;
  std::string save_model;
  int final_eval_timeout_s = 120;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 100;
  int keep_checkpoints = 3;
  double worker_timeout_s = 10;
  std::string on_worker_loss = "wait";
  std::string grad_encoding = "f32";
  std::string weight_encoding = "f32";
  int update_threads = 0;
  bool exit_when_done = true;
  bool dry_run = false;
};

absl::Status Validate(const ServerFlags& f) {
  if (f.port < 0 || f.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--port must be in 0..65535, got %d", f.port));
  }
  if (f.health_port < -1 || f.health_port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--health_port must be in -1..65535, got %d", f.health_port));
  }
  if (absl::Status s = ValidateMetricsPort(f.metrics_port); !s.ok()) return s;
  if (f.workers < 1 || f.workers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--workers must be in 1..1024, got %d", f.workers));
  }
  if (f.batch_size < 1 || f.batch_size > 65536) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--batch_size must be in 1..65536, got %d", f.batch_size));
  }
  if (f.epochs < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--epochs must be >= 1, got %d", f.epochs));
  }
  if (!(f.lr > 0.0) || !std::isfinite(f.lr)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--lr must be a positive number, got %g", f.lr));
  }
  if (f.max_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max_steps must be >= 0, got %d", f.max_steps));
  }
  if (f.dataset != "fashion-mnist" && f.dataset != "mnist" &&
      f.dataset != "synthetic") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--dataset must be fashion-mnist, mnist or synthetic, got '%s'",
        f.dataset));
  }
  if (f.checkpoint_every < 0 || f.keep_checkpoints < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--checkpoint_every must be >= 0 and --keep_checkpoints >= 1, got %d "
        "and %d",
        f.checkpoint_every, f.keep_checkpoints));
  }
  if (!(f.worker_timeout_s > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--worker_timeout_s must be > 0, got %g", f.worker_timeout_s));
  }
  if (auto e = ParseEncoding(f.grad_encoding); !e.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grad_encoding: ", e.status().message()));
  }
  if (auto e = ParseEncoding(f.weight_encoding); !e.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight_encoding: ", e.status().message()));
  }
  if (f.update_threads < 0 || f.update_threads > 256) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--update_threads must be in 0..256, got %d", f.update_threads));
  }
  if (f.on_worker_loss != "wait" && f.on_worker_loss != "fail") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--on_worker_loss must be wait or fail, got '%s'", f.on_worker_loss));
  }
  return absl::OkStatus();
}

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
  return p;
}

// Blocks SIGINT/SIGTERM in every thread and hands them to one watcher, so
// that gRPC's threads never run a handler.
void BlockStopSignals(sigset_t* set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, set, nullptr);
}

int Run(int argc, char** argv) {
  SetLogTag("dp-ps");
  ServerFlags f;
  Flags flags("dp-ps", "Parameter server for synchronous data-parallel "
                       "training of SimpleNet (784-256-128-10).");
  flags.AddString("host", &f.host, "address to listen on");
  flags.AddInt("port", &f.port, "gRPC port (0 picks a free one)");
  flags.AddInt("health_port", &f.health_port,
               "plaintext port serving only grpc.health.v1, for probes that "
               "speak no TLS (-1 = off, 0 = any free port)");
  flags.AddInt("metrics_port", &f.metrics_port,
               "Prometheus metrics port (0 = off, -1 = any free port)");
  flags.AddString("metrics_host", &f.metrics_host,
                  "address the metrics endpoint listens on");
  flags.AddInt("workers", &f.workers, "number of workers N");
  flags.AddInt("batch_size", &f.batch_size, "batch size per worker");
  flags.AddInt("epochs", &f.epochs, "epochs to train");
  flags.AddDouble("lr", &f.lr, "Adam learning rate");
  flags.AddInt("seed", &f.seed, "seed of initialisation and data order");
  flags.AddBool("shuffle", &f.shuffle, "shuffle the data every epoch");
  flags.AddString("dataset", &f.dataset, "fashion-mnist | mnist | synthetic");
  flags.AddInt("max_steps", &f.max_steps,
               "stop after this many steps (0 = all epochs)");
  flags.AddString("init_model", &f.init_model,
                  "start from these weights (safetensors) instead of --seed");
  flags.AddString("save_model", &f.save_model,
                  "write the final weights here (safetensors)");
  flags.AddInt("final_eval_timeout_s", &f.final_eval_timeout_s,
               "how long to wait for rank 0's final test accuracy");
  flags.AddString("grad_encoding", &f.grad_encoding,
                  "how workers send gradients: f32 | bf16 (half the bytes; "
                  "dp-ps averages in float32)");
  flags.AddString("weight_encoding", &f.weight_encoding,
                  "how dp-ps sends the weights: f32 | bf16 (half the bytes; "
                  "workers compute on rounded weights, dp-ps keeps and "
                  "updates them in float32)");
  flags.AddInt("update_threads", &f.update_threads,
               "threads for the average + Adam update (0 = one per core, at "
               "most 4; the result is the same for any number)");
  flags.AddString("checkpoint_dir", &f.checkpoint_dir,
                  "write checkpoints here and resume from the newest valid "
                  "one at start (empty = no checkpoints)");
  flags.AddInt("checkpoint_every", &f.checkpoint_every,
               "steps between checkpoints (0 = only at shutdown and the end)");
  flags.AddInt("keep_checkpoints", &f.keep_checkpoints,
               "how many checkpoints to keep");
  flags.AddDouble("worker_timeout_s", &f.worker_timeout_s,
                  "a worker the step needs that has not called for this long "
                  "is reported missing");
  flags.AddString("on_worker_loss", &f.on_worker_loss,
                  "wait (keep the step open until the rank comes back) | fail "
                  "(end the job with an error)");
  flags.AddBool("exit_when_done", &f.exit_when_done,
                "exit once training is finished; false keeps serving the "
                "final weights and status until SIGTERM (Kubernetes)");
  flags.AddBool("dry_run", &f.dry_run,
                "validate the flags and DP_* environment, print the "
                "effective configuration and exit");
  SecurityFlags security_flags;
  AddSecurityFlags(&flags, &security_flags, Side::kServer);
  auto action = flags.Parse(argc, argv);
  if (!action.ok()) {
    std::fprintf(stderr, "%s\n", std::string(action.status().message()).c_str());
    return kExitConfigError;
  }
  if (*action == Flags::Action::kExit) return kExitOk;
  if (absl::Status s = Validate(f); !s.ok()) {
    Log("configuration error: %s", s.message());
    return kExitConfigError;
  }
  if (f.dry_run) return FinishDryRun(flags);
  WarnUnknownEnvironment(flags);
  Log("dp-ps %s starting: %s", DP_VERSION, flags.Effective());

  const ModelLayout layout = ModelLayout::SimpleNet();
  JobConfig config;
  config.schedule.world_size = f.workers;
  config.schedule.batch_size = f.batch_size;
  config.schedule.epochs = f.epochs;
  config.schedule.max_steps = f.max_steps;
  config.schedule.seed = static_cast<uint64_t>(f.seed);
  config.schedule.shuffle = f.shuffle;
  config.dataset = f.dataset;
  config.adam.lr = f.lr;
  config.grad_encoding = *ParseEncoding(f.grad_encoding);
  config.weight_encoding = *ParseEncoding(f.weight_encoding);

  // A write beyond a file-size limit must be an error, not a crash.
  signal(SIGXFSZ, SIG_IGN);
  // Before any thread starts, so that every thread inherits the mask.
  sigset_t stop_signals;
  BlockStopSignals(&stop_signals);

  // After the signal mask: building credentials starts gRPC's threads.
  auto security = LoadServerSecurity(security_flags);
  if (!security.ok()) {
    Log("configuration error: %s", security.status().message());
    return kExitConfigError;
  }
  Log("security: %s", security->Describe());
  if (auto warning = PlaintextWarning(f.host, *security)) Log("%s", *warning);

  std::unique_ptr<CheckpointStore> store;
  std::optional<Checkpoint> resumed;
  if (!f.checkpoint_dir.empty()) {
    store = std::make_unique<CheckpointStore>(f.checkpoint_dir, layout,
                                              f.keep_checkpoints);
    if (absl::Status s = store->Open(); !s.ok()) {
      Log("configuration error: %s", s.message());
      return kExitConfigError;
    }
    resumed = store->LoadNewest();
    if (resumed.has_value()) {
      if (absl::Status s = CheckResumable(resumed->config, config); !s.ok()) {
        Log("configuration error: %s: %s", f.checkpoint_dir, s.message());
        return kExitConfigError;
      }
    }
  }

  TrainingState state;
  if (resumed.has_value()) {
    state = resumed->state;
    Log("resuming from the checkpoint of step %d in %s", state.step,
        f.checkpoint_dir);
  } else if (!f.init_model.empty()) {
    auto params = LoadSafetensors(f.init_model, layout);
    if (!params.ok()) {
      Log("configuration error: --init_model: %s", params.status().message());
      return kExitConfigError;
    }
    state.params = std::move(*params);
    Log("initial weights from %s", f.init_model);
  } else {
    state.params = InitParams(layout, static_cast<uint64_t>(f.seed));
  }

  ServerMetrics metrics(f.workers);
  // Workers wait while the update runs, so its threads take no CPU from
  // them; beyond 4 the update is bound by memory, not cores.
  const int update_threads =
      f.update_threads > 0
          ? f.update_threads
          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()),
                       1, 4);
  StepCoordinator coordinator(layout, config, std::move(state),
                              update_threads);
  Log("the update runs on %d thread%s", update_threads,
      update_threads == 1 ? "" : "s");
  coordinator.SetUpdateObserver(
      [&metrics](absl::Duration d) { metrics.ObserveUpdate(d); });
  if (resumed.has_value() && resumed->data.has_value()) {
    if (absl::Status s = coordinator.RestoreData(*resumed->data); !s.ok()) {
      Log("configuration error: checkpoint in %s: %s", f.checkpoint_dir,
          s.message());
      return kExitConfigError;
    }
  }
  // The state as a checkpoint; the data fingerprint is whatever the
  // coordinator knows now.
  auto make_checkpoint = [&](TrainingState s) {
    return Checkpoint{config, coordinator.data(), std::move(s)};
  };
  if (store != nullptr) {
    coordinator.SetCheckpointHook(f.checkpoint_every, [&](TrainingState s) {
      store->WriteAsync(make_checkpoint(std::move(s)));
    });
  }
  // Written synchronously when dp-ps stops (signal, failure) and at the end.
  // After Shutdown() or Fail() nothing changes the state any more, so the
  // checkpoint is the last applied step (a partially pushed step is dropped).
  auto final_checkpoint = [&]() -> absl::Status {
    if (store == nullptr) return absl::OkStatus();
    store->Flush();
    TrainingState s = coordinator.Snapshot();
    const int64_t step = s.step;
    absl::Status st = store->Write(make_checkpoint(std::move(s)));
    if (!st.ok()) {
      Log("error: %s", st.message());
    } else {
      Log("checkpoint of step %d written to %s", step, f.checkpoint_dir);
    }
    return st;
  };

  PsService service(&coordinator, &metrics, {security->auth_token});
  // Declared after what it reads, so it stops serving before they go.
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  if (f.metrics_port != kMetricsOff) {
    auto endpoint = metrics.Serve(f.metrics_host, f.metrics_port, [&] {
      metrics.SetProgress(ProgressOf(coordinator.Status()));
    });
    if (!endpoint.ok()) {
      Log("error: %s", endpoint.status().message());
      return kExitFailure;
    }
    metrics_endpoint = std::move(*endpoint);
    Log("metrics on %s:%d", f.metrics_host, metrics_endpoint->port());
  }
  GrpcServerOptions options;
  options.credentials = security->credentials;
  options.address = absl::StrFormat("%s:%d", f.host, f.port);
  options.max_message_bytes = MessageBytesFor(layout.num_params());
  auto running = StartGrpcServer(options, {&service});
  if (!running.ok()) {
    Log("error: %s", running.status().message());
    return kExitFailure;
  }
  const std::vector<std::string> health_services = {
      dp::v1::ParameterServer::service_full_name()};
  // With TLS on --port, the kubelet's probes use this plaintext port.
  std::unique_ptr<HealthServer> health;
  if (f.health_port >= 0) {
    auto started = HealthServer::Start(f.host, f.health_port);
    if (!started.ok()) {
      Log("error: health service: %s", started.status().message());
      return kExitFailure;
    }
    health = std::move(*started);
    Log("health service on port %d", health->port());
  }
  SetReady(running->server.get(), true, health_services);
  if (health != nullptr) {
    health->SetReady(true, health_services);
  }
  Log("listening on %s:%d for %d workers", f.host, running->port, f.workers);
  auto stop_server = [&]() {
    coordinator.Shutdown();
    running->server->Shutdown(
        absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  };

  // Shared with the watcher, which may outlive Run: static.
  static std::atomic<int> stop_signal{0};
  static absl::Notification drained;
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    stop_signal.store(sig);
    // Readiness first, so that probes see the drain before requests fail.
    SetReady(running->server.get(), false, health_services);
    if (health != nullptr) {
      health->SetReady(false, health_services);
    }
    coordinator.Shutdown();  // refuses steps; wakes the progress loop below
    drained.Notify();
  });
  watcher.detach();

  // Every 100 ms: worker leases; every second: progress (epoch, step/total,
  // loss, samples/s, ETA).
  const absl::Time start = absl::Now();
  const absl::Duration worker_timeout = absl::Seconds(f.worker_timeout_s);
  absl::Time last_print = start;
  int64_t last_step = -1;
  absl::Status failure;
  while (!coordinator.AwaitDone(absl::Milliseconds(100))) {
    if (stop_signal.load() != 0) break;
    for (const auto& e : coordinator.CheckLeases(worker_timeout)) {
      const double secs = absl::ToDoubleSeconds(e.silent);
      if (e.kind == StepCoordinator::LeaseEvent::kNeverRegistered) {
        Log("rank %d has not registered yet (%.1f s since start)", e.rank, secs);
      } else if (e.kind == StepCoordinator::LeaseEvent::kBack) {
        Log("rank %d is back after %.1f s", e.rank, secs);
      } else if (f.on_worker_loss == "fail") {
        failure = JobFailedError(absl::StrFormat(
            "rank %d was lost (no call for %.1f s, --on_worker_loss=fail)",
            e.rank, secs));
      } else {
        Log("rank %d is missing: no call for %.1f s; step %d waits for it "
            "(--on_worker_loss=wait)",
            e.rank, secs, coordinator.Status().step);
      }
    }
    if (!failure.ok()) break;
    const absl::Time now = absl::Now();
    if (now - last_print < absl::Seconds(1)) continue;
    CoordinatorStatus s = coordinator.Status();
    if (s.total_steps == 0 || s.step == last_step) continue;
    const double rate =
        last_step < 0 ? 0.0
                      : (s.step - last_step) /
                            absl::ToDoubleSeconds(now - last_print);
    const double samples_per_s = rate * s.config.schedule.global_batch();
    const double eta = rate > 0 ? (s.total_steps - s.step) / rate : 0.0;
    Log("epoch %d/%d  step %d/%d  loss %.4f  %.0f samples/s  ETA %.0fs",
        s.config.schedule.epoch_of(std::min(s.step, s.total_steps - 1)) + 1,
        s.config.schedule.epochs, s.step, s.total_steps, s.last_loss,
        samples_per_s, eta);
    last_step = s.step;
    last_print = now;
  }
  if (!failure.ok()) {
    Log("error: %s", failure.message());
    coordinator.Fail(failure);
    (void)final_checkpoint();  // logged; the exit code already says failure
    // Serve the failure to workers already in a call before going away.
    running->server->Shutdown(
        absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
    return kExitFailure;
  }
  if (int sig = stop_signal.load(); sig != 0 && !coordinator.done()) {
    drained.WaitForNotification();
    Log("stopped by signal %d at step %d; draining", sig,
        coordinator.Status().step);
    const absl::Status s = final_checkpoint();
    running->server->Shutdown(
        absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    return s.ok() ? kExitInterrupted : kExitFailure;
  }

  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  (void)final_checkpoint();  // logged; the model file below is the result
  if (!f.save_model.empty()) {
    const TrainingState final_state = coordinator.Snapshot();
    if (absl::Status s =
            SaveSafetensors(f.save_model, layout, final_state.params);
        !s.ok()) {
      Log("error: cannot save the model: %s", s.message());
      stop_server();
      return kExitFailure;
    }
    Log("saved the model to %s", f.save_model);
  }
  const bool have_eval =
      coordinator.AwaitFinalEval(absl::Seconds(f.final_eval_timeout_s));
  CoordinatorStatus s = coordinator.Status();
  // The training rate, from the first update to the last.
  const double train_seconds =
      absl::ToDoubleSeconds(s.last_apply - s.first_apply);
  const double rate = train_seconds > 0
                          ? (s.step - s.first_applied_step) *
                                double(s.config.schedule.global_batch()) /
                                train_seconds
                          : 0.0;
  Log("done: %d steps in %.1f s, %.0f samples/s while training, final loss "
      "%.4f",
      s.step, seconds, rate, s.last_loss);
  if (s.applies > 0) {
    std::string waits;
    for (size_t r = 0; r < s.wait_time.size(); ++r) {
      absl::StrAppendFormat(&waits, " rank %d %.3f ms", r,
                            absl::ToDoubleMilliseconds(s.wait_time[r]) /
                                s.applies);
    }
    Log("per step: update %.3f ms; from push to published update:%s",
        absl::ToDoubleMilliseconds(s.apply_time) / s.applies, waits);
  }
  if (have_eval) {
    Log("final test accuracy: %.4f", s.last_eval.accuracy);
  } else {
    Log("no final test accuracy from rank 0 within %d s",
        f.final_eval_timeout_s);
  }
  if (!f.exit_when_done) {
    Log("serving the final weights and status until SIGTERM");
    drained.WaitForNotification();
  }
  stop_server();
  return kExitOk;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  dp::KeepLargeBuffersInHeap();
  return dp::Run(argc, argv);
}
