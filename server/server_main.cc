// dp-ps: parses flags, builds the parameter store and serves it until every
// step is applied, then saves the model and exits 0.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/dataset.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "server/ps_service.h"
#include "server/step_coordinator.h"

namespace dp {
namespace {

struct ServerFlags {
  std::string host = "0.0.0.0";
  int port = 5000;
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
};

absl::Status Validate(const ServerFlags& f) {
  if (f.port < 0 || f.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--port must be in 0..65535, got %d", f.port));
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
  Log("dp-ps %s starting: %s", DP_VERSION, flags.Effective());

  const ModelLayout layout = ModelLayout::SimpleNet();
  TrainingState state;
  if (!f.init_model.empty()) {
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

  JobConfig config;
  config.schedule.world_size = f.workers;
  config.schedule.batch_size = f.batch_size;
  config.schedule.epochs = f.epochs;
  config.schedule.max_steps = f.max_steps;
  config.schedule.seed = static_cast<uint64_t>(f.seed);
  config.schedule.shuffle = f.shuffle;
  config.dataset = f.dataset;
  config.adam.lr = f.lr;

  sigset_t stop_signals;
  BlockStopSignals(&stop_signals);

  ServerMetrics metrics(f.workers);
  StepCoordinator coordinator(layout, config, std::move(state));
  coordinator.SetUpdateObserver(
      [&metrics](absl::Duration d) { metrics.ObserveUpdate(d); });
  PsService service(&coordinator, &metrics);
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
  options.address = absl::StrFormat("%s:%d", f.host, f.port);
  options.max_message_bytes = MessageBytesFor(layout.num_params());
  auto running = StartGrpcServer(options, {&service});
  if (!running.ok()) {
    Log("error: %s", running.status().message());
    return kExitFailure;
  }
  Log("listening on %s:%d for %d workers", f.host, running->port, f.workers);

  std::atomic<int> stop_signal{0};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    stop_signal.store(sig);
    coordinator.Shutdown();  // wakes the progress loop below
  });
  watcher.detach();

  // Progress, once a second: epoch, step/total, loss, samples/s, ETA.
  const absl::Time start = absl::Now();
  absl::Time last_time = start;
  int64_t last_step = -1, first_step = -1;
  while (!coordinator.AwaitDone(absl::Seconds(1))) {
    if (stop_signal.load() != 0) break;
    CoordinatorStatus s = coordinator.Status();
    if (s.total_steps == 0 || s.step == last_step) continue;
    const absl::Time now = absl::Now();
    if (first_step < 0) first_step = s.step;
    const double rate =
        last_step < 0 ? 0.0
                      : (s.step - last_step) /
                            absl::ToDoubleSeconds(now - last_time);
    const double samples_per_s = rate * s.config.schedule.global_batch();
    const double eta = rate > 0 ? (s.total_steps - s.step) / rate : 0.0;
    Log("epoch %d/%d  step %d/%d  loss %.4f  %.0f samples/s  ETA %.0fs",
        s.config.schedule.epoch_of(std::min(s.step, s.total_steps - 1)) + 1,
        s.config.schedule.epochs, s.step, s.total_steps, s.last_loss,
        samples_per_s, eta);
    last_step = s.step;
    last_time = now;
  }
  if (int sig = stop_signal.load(); sig != 0) {
    Log("stopped by signal %d at step %d", sig, coordinator.Status().step);
    running->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    return kExitInterrupted;
  }

  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  TrainingState final_state = coordinator.Snapshot();
  if (!f.save_model.empty()) {
    if (absl::Status s = SaveSafetensors(f.save_model, layout, final_state.params);
        !s.ok()) {
      Log("error: cannot save the model: %s", s.message());
      coordinator.Shutdown();
      running->server->Shutdown();
      return kExitFailure;
    }
    Log("saved the model to %s", f.save_model);
  }
  const bool have_eval =
      coordinator.AwaitFinalEval(absl::Seconds(f.final_eval_timeout_s));
  CoordinatorStatus s = coordinator.Status();
  coordinator.Shutdown();
  running->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  const double samples = static_cast<double>(s.step) *
                         s.config.schedule.global_batch();
  Log("done: %d steps, %.1f s, %.0f samples/s, final loss %.4f", s.step,
      seconds, samples / seconds, s.last_loss);
  if (have_eval) {
    Log("final test accuracy: %.4f", s.last_eval.accuracy);
  } else {
    Log("no final test accuracy from rank 0 within %d s",
        f.final_eval_timeout_s);
  }
  return kExitOk;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) { return dp::Run(argc, argv); }
