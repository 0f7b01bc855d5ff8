// dp-ps: parses and checks flags (server/server_flags.h), runs a PsServer
// (server/ps_server.h) and turns its outcome into the exit code; signals
// reach it through a watcher thread.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/job_failure.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/model_layout.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "proto/grpc_server.h"
#include "proto/security.h"
#include "server/model_export.h"
#include "server/ps_server.h"
#include "server/server_flags.h"

namespace dp {
namespace {

// SIGUSR1 tells the signal watcher that Run is over: it returns, and the
// server it forwards signals to is destroyed only after it has.
constexpr int kWatcherExit = SIGUSR1;

// Blocks SIGINT, SIGTERM and kWatcherExit in every thread and hands them to
// one watcher, so that gRPC's threads never run a handler.
void BlockStopSignals(sigset_t* set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigaddset(set, kWatcherExit);
  pthread_sigmask(SIG_BLOCK, set, nullptr);
}

// A server that cannot start: exit 1 when it cannot serve (UNAVAILABLE: a
// port in use), else 2 (the checkpoint, model or flags given).
int StartExitCode(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ? kExitFailure
                                                    : kExitConfigError;
}

// "configuration error: ..." and kExitConfigError, for main to return.
int ConfigError(const absl::Status& s) {
  Log("configuration error: %s", s.message());
  return kExitConfigError;
}

// --export_checkpoint: the model in checkpoint files to --save_model, and
// no job. Bad files are the caller's input: exit 2, nothing written. The
// model is the job's (--layers, or --init_model's tensors, checked with the
// flags), by default SimpleNet.
int ExportCheckpoint(const ServerFlags& f, const JobConfig& job) {
  absl::StatusOr<ModelLayout> job_layout = LayoutOfJob(job, "the model");
  if (!job_layout.ok()) return ConfigError(job_layout.status());
  const ModelLayout& layout = *job_layout;
  const std::vector<std::string> files =
      absl::StrSplit(f.export_checkpoint, ',', absl::SkipEmpty());
  absl::StatusOr<ExportedModel> model = ModelFromCheckpoints(layout, files);
  if (!model.ok()) return ConfigError(model.status());
  if (absl::Status s = SaveSafetensors(f.save_model, layout, model->params);
      !s.ok()) {
    Log("error: cannot save the model: %s", s.message());
    return kExitFailure;
  }
  Log("wrote the model of step %d from %d checkpoint file%s to %s", model->step,
      files.size(), files.size() == 1 ? "" : "s", f.save_model);
  return kExitOk;
}

// The server's credentials, and (sharded) those shard 0 calls the others
// with, from the same files.
absl::Status LoadSecurity(const ServerFlags& f, PsServerOptions* o) {
  ASSIGN_OR_RETURN(ServerSecurity security, LoadServerSecurity(f.security));
  Log("security: %s", security.Describe());
  if (auto warning = PlaintextWarning(f.host, security)) Log("%s", *warning);
  o->security = std::move(security);
  if (f.shards > 1) {
    ASSIGN_OR_RETURN(const ClientSecurity client,
                     LoadClientSecurity(f.security));
    o->gather.credentials = client.credentials;
    o->gather.auth_token = client.auth_token;
  }
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  SetLogTag("dp-ps");
  ServerFlags f;
  Flags flags("dp-ps",
              "Parameter server for synchronous data-parallel "
              "training of an MLP (--layers; SimpleNet, 784-256-128-10, by "
              "default) or of any named float32 tensors (--init_model).");
  AddServerFlags(&flags, &f);
  if (std::optional<int> exit =
          ParseCommandLine(&flags, &f.dry_run, argc, argv)) {
    return *exit;
  }
  if (absl::Status s = ValidateServerFlags(flags, f); !s.ok())
    return ConfigError(s);
  absl::StatusOr<PsServerOptions> options = ServerOptionsFromFlags(f);
  if (!options.ok()) return ConfigError(options.status());
  if (f.dry_run) return FinishDryRun(flags);
  if (!f.export_checkpoint.empty()) {
    return ExportCheckpoint(f, options->config);
  }
  WarnUnknownEnvironment(flags);
  Log("dp-ps %s starting: %s", DP_VERSION, flags.Effective());
  const Schedule& schedule = options->config.schedule;
  Log("a step: %d micro-batches of %d samples (global batch %d), on %s at "
      "a time",
      schedule.micro_batches, schedule.batch_size,
      int64_t{schedule.micro_batches} * schedule.batch_size,
      f.min_workers == f.workers
          ? absl::StrFormat("%d worker%s", f.workers, f.workers == 1 ? "" : "s")
          : absl::StrFormat("%d to %d workers", f.min_workers, f.workers));
  Log("the model: %s", LayoutOfJob(options->config, "")->Describe());
  PsServerOptions o = *std::move(options);

  // A write beyond a file-size limit must be an error, not a crash.
  signal(SIGXFSZ, SIG_IGN);
  // Before any thread starts, so that every thread inherits the mask.
  sigset_t signals;
  BlockStopSignals(&signals);
  KeepGrpcForTheProcess();  // starts gRPC's threads: after the mask

  // After the signal mask: building credentials starts gRPC's threads.
  if (absl::Status s = LoadSecurity(f, &o); !s.ok()) return ConfigError(s);

  absl::StatusOr<std::unique_ptr<PsServer>> server =
      PsServer::Start(std::move(o));
  if (!server.ok()) {
    const int code = StartExitCode(server.status());
    Log("%s: %s", code == kExitConfigError ? "configuration error" : "error",
        server.status().message());
    return code;
  }
  // Forwards SIGINT/SIGTERM to the server until told to return; joined
  // before the server goes, so it never touches a destroyed one.
  std::thread watcher([&signals, s = server->get()] {
    for (;;) {
      int sig = 0;
      sigwait(&signals, &sig);
      if (sig == kWatcherExit) return;
      s->Stop(sig);
    }
  });
  const absl::StatusOr<PsServer::Outcome> outcome = (*server)->Run();
  pthread_kill(watcher.native_handle(), kWatcherExit);
  watcher.join();
  server->reset();
  if (!outcome.ok()) {
    if (!IsJobFailed(outcome.status())) {
      Log("error: %s", outcome.status().message());
    }
    return kExitFailure;
  }
  return *outcome == PsServer::Outcome::kFinished ? kExitOk : kExitInterrupted;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  dp::KeepLargeBuffersInHeap();
  return dp::Run(argc, argv);
}
