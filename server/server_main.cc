// dp-ps: parses and checks flags, runs a PsServer (server/ps_server.h) and
// turns its outcome into the exit code; signals reach it through a watcher
// thread.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/metrics.h"
#include "common/security.h"
#include "common/shard_plan.h"
#include "common/tensor_codec.h"
#include "server/ps_server.h"

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
  int64_t global_batch = 0;  // 0: batch_size x workers
  int micro_batch = 0;       // 0: batch_size
  int min_workers = 1;
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
  std::string on_worker_loss = "reassign";
  int backup_blocks = 1;
  double straggler_factor = 3.0;
  int straggler_min_wait_ms = 20;
  double start_wait_s = 30;
  std::string grad_encoding = "f32";
  std::string weight_encoding = "f32";
  int update_threads = 0;
  bool exit_when_done = true;
  bool shared_memory = true;
  int shards = 1;
  int shard = -1;
  std::string shard_addresses;
  bool dry_run = false;
};

// The most micro-batches a step: --global_batch / --micro_batch.
constexpr int kMaxMicroBatches = 65536;

// Samples per micro-batch: --micro_batch, by default --batch_size.
int MicroBatch(const ServerFlags& f) {
  return f.micro_batch > 0 ? f.micro_batch : f.batch_size;
}

// Samples per step: --global_batch, by default --batch_size x --workers.
int64_t GlobalBatch(const ServerFlags& f) {
  return f.global_batch > 0 ? f.global_batch
                            : int64_t{f.batch_size} * f.workers;
}

// --shard, or the ordinal at the end of the host name (a StatefulSet's pod
// "dp-ps-2" is shard 2), or 0 for a job of one shard.
absl::StatusOr<int> ShardIndex(const ServerFlags& f) {
  if (f.shard >= 0 || f.shards <= 1) return std::max(f.shard, 0);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const absl::string_view name(host);
  const size_t dash = name.rfind('-');
  int ordinal = -1;
  if (dash == absl::string_view::npos ||
      !absl::SimpleAtoi(name.substr(dash + 1), &ordinal) || ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shards=%d needs --shard (or DP_SHARD); the host name '%s' ends in "
        "no StatefulSet ordinal",
        f.shards, name));
  }
  return ordinal;
}

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
  if (f.micro_batch < 0 || f.micro_batch > 65536) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--micro_batch must be in 1..65536 (0: --batch_size), got %d",
        f.micro_batch));
  }
  const int micro_batch = MicroBatch(f);
  const int64_t global_batch = GlobalBatch(f);
  if (f.global_batch < 0 || global_batch % micro_batch != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--global_batch must be a positive multiple of --micro_batch (%d), "
        "got %s",
        micro_batch,
        f.global_batch != 0
            ? absl::StrCat(f.global_batch)
            : absl::StrCat(global_batch, " (--batch_size x --workers)")));
  }
  const int64_t micro_batches = global_batch / micro_batch;
  if (micro_batches > kMaxMicroBatches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--global_batch / --micro_batch must be at most %d micro-batches a "
        "step, got %d / %d = %d",
        kMaxMicroBatches, global_batch, micro_batch, micro_batches));
  }
  if (f.min_workers < 1 || f.min_workers > f.workers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--min_workers must be in 1..%d (--workers), got %d",
                        f.workers, f.min_workers));
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
  if (f.shards < 1 || f.shards > kMaxShards) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--shards must be in 1..%d, got %d", kMaxShards, f.shards));
  }
  if (f.shard < -1 || f.shard >= f.shards) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--shard must be in 0..%d (--shards=%d), got %d",
                        f.shards - 1, f.shards, f.shard));
  }
  if (f.on_worker_loss != "reassign" && f.on_worker_loss != "wait" &&
      f.on_worker_loss != "fail") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--on_worker_loss must be reassign, wait or fail, got '%s'",
        f.on_worker_loss));
  }
  if (f.backup_blocks < 0 || f.backup_blocks > micro_batches) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--backup_blocks must be in 0..%d (the micro-batches a step), got %d",
        micro_batches, f.backup_blocks));
  }
  if (!(f.straggler_factor > 1.0) || !std::isfinite(f.straggler_factor)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--straggler_factor must be a number > 1, got %g", f.straggler_factor));
  }
  if (!(f.start_wait_s >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--start_wait_s must be >= 0, got %g", f.start_wait_s));
  }
  if (f.straggler_min_wait_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--straggler_min_wait_ms must be >= 0, got %d",
                        f.straggler_min_wait_ms));
  }
  return absl::OkStatus();
}

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

int Run(int argc, char** argv) {
  SetLogTag("dp-ps");
  ServerFlags f;
  Flags flags("dp-ps",
              "Parameter server for synchronous data-parallel "
              "training of SimpleNet (784-256-128-10).");
  flags.AddString("host", &f.host, "address to listen on");
  flags.AddInt("port", &f.port, "gRPC port (0 picks a free one)");
  flags.AddInt("health_port", &f.health_port,
               "plaintext port serving only grpc.health.v1, for probes that "
               "speak no TLS (-1 = off, 0 = any free port)");
  flags.AddInt("metrics_port", &f.metrics_port,
               "Prometheus metrics port (0 = off, -1 = any free port)");
  flags.AddString("metrics_host", &f.metrics_host,
                  "address the metrics endpoint listens on (0.0.0.0 or ::: "
                  "every IPv4 and IPv6 address; an IPv6 address with or "
                  "without brackets)");
  flags.AddInt("workers", &f.workers,
               "the most workers at once (ranks 0..N-1)");
  flags.AddInt("batch_size", &f.batch_size,
               "batch size per worker: the default --micro_batch");
  flags.AddInt("global_batch", &f.global_batch,
               "samples a step, a multiple of --micro_batch; the model "
               "depends on it, not on how many workers compute it (0 = "
               "--batch_size x --workers)");
  flags.AddInt("micro_batch", &f.micro_batch,
               "samples a micro-batch, the unit of work handed to a worker "
               "(0 = --batch_size)");
  flags.AddInt("min_workers", &f.min_workers,
               "steps wait while fewer workers are live (1..--workers)");
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
               "how long to wait for rank 0's final test accuracy; sharded, "
               "also how long shard 0 waits for a shard that does not answer "
               "while it collects the model, and how long another shard "
               "waits for shard 0 to collect its weights");
  flags.AddString("grad_encoding", &f.grad_encoding,
                  "how workers send gradients: f32 | bf16 (half the bytes; "
                  "dp-ps averages in float32)");
  flags.AddString("weight_encoding", &f.weight_encoding,
                  "how dp-ps sends the weights: f32 | bf16 (half the bytes; "
                  "workers compute on rounded weights, dp-ps keeps and "
                  "updates them in float32)");
  flags.AddInt("update_threads", &f.update_threads,
               "threads for the average + Adam update (0 = one per 1Mi "
               "parameters: SimpleNet gets one; at most one per usable core "
               "(the cgroup's CPU limit counts) and 4; the result is the "
               "same for any number)");
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
                  "reassign (a lost worker's micro-batches go to the others) "
                  "| wait (keep the step open until the rank comes back) | "
                  "fail (end the job with an error)");
  flags.AddInt("backup_blocks", &f.backup_blocks,
               "late blocks a step also handed to an idle worker; the first "
               "copy counts (0 = no straggler backups)");
  flags.AddDouble("straggler_factor", &f.straggler_factor,
                  "a block is late once the step has run this many times as "
                  "long as the step's first push took (> 1)");
  flags.AddInt("straggler_min_wait_ms", &f.straggler_min_wait_ms,
               "a block is never late sooner than this into the step");
  flags.AddDouble("start_wait_s", &f.start_wait_s,
                  "the first step waits this long for all --workers to "
                  "register, then starts with those there (at least "
                  "--min_workers)");
  flags.AddBool("shared_memory", &f.shared_memory,
                "offer workers on this host (this network namespace) their "
                "tensors through shared memory; gRPC stays the control "
                "plane");
  flags.AddInt("shards", &f.shards,
               "how many dp-ps processes share the parameters; each owns a "
               "range of them (1 = this dp-ps holds all)");
  flags.AddInt("shard", &f.shard,
               "which of the --shards this dp-ps is (-1 = the ordinal at "
               "the end of the host name, as in a StatefulSet)");
  flags.AddString("shard_addresses", &f.shard_addresses,
                  "the shards' host:port, comma-separated (shard 0 collects "
                  "the model from them at the end; its own may be listed); "
                  "an entry with {shard} stands for one per shard");
  flags.AddBool("exit_when_done", &f.exit_when_done,
                "exit once training is finished; false keeps serving the "
                "final weights and status until SIGTERM (Kubernetes)");
  SecurityFlags security_flags;
  AddSecurityFlags(&flags, &security_flags, Side::kServer);
  if (std::optional<int> exit =
          ParseCommandLine(&flags, &f.dry_run, argc, argv)) {
    return *exit;
  }
  if (absl::Status s = Validate(f); !s.ok()) {
    Log("configuration error: %s", s.message());
    return kExitConfigError;
  }
  absl::StatusOr<int> shard = ShardIndex(f);
  const absl::StatusOr<std::vector<std::string>> peers =
      ExpandShardTemplate(f.shard_addresses, f.shards);
  if (shard.ok() && !peers.ok()) {
    shard = absl::InvalidArgumentError(
        absl::StrCat("--shard_addresses: ", peers.status().message()));
  }
  if (shard.ok()) {
    if (absl::Status s = CheckShardAddresses(f.shards, *shard, peers->size());
        !s.ok()) {
      shard = s;
    }
  }
  if (!shard.ok()) {
    Log("configuration error: %s", shard.status().message());
    return kExitConfigError;
  }
  if (f.dry_run) return FinishDryRun(flags);
  WarnUnknownEnvironment(flags);
  Log("dp-ps %s starting: %s", DP_VERSION, flags.Effective());
  Log("a step: %d micro-batches of %d samples (global batch %d), on %s at "
      "a time",
      GlobalBatch(f) / MicroBatch(f), MicroBatch(f), GlobalBatch(f),
      f.min_workers == f.workers
          ? absl::StrFormat("%d worker%s", f.workers, f.workers == 1 ? "" : "s")
          : absl::StrFormat("%d to %d workers", f.min_workers, f.workers));

  PsServerOptions o;
  o.host = f.host;
  o.port = f.port;
  o.health_port = f.health_port;
  o.metrics_port = f.metrics_port;
  o.metrics_host = f.metrics_host;
  Schedule& schedule = o.config.schedule;
  schedule.world_size = f.workers;
  schedule.batch_size = MicroBatch(f);
  schedule.micro_batches = static_cast<int>(GlobalBatch(f) / MicroBatch(f));
  schedule.epochs = f.epochs;
  schedule.max_steps = f.max_steps;
  schedule.seed = static_cast<uint64_t>(f.seed);
  schedule.shuffle = f.shuffle;
  o.config.min_workers = f.min_workers;
  o.config.dataset = f.dataset;
  o.config.adam.lr = f.lr;
  o.config.grad_encoding = *ParseEncoding(f.grad_encoding);
  o.config.weight_encoding = *ParseEncoding(f.weight_encoding);
  o.init_model = f.init_model;
  o.save_model = f.save_model;
  o.final_eval_timeout = absl::Seconds(f.final_eval_timeout_s);
  o.checkpoint_dir = f.checkpoint_dir;
  o.checkpoint_every = f.checkpoint_every;
  o.keep_checkpoints = f.keep_checkpoints;
  o.worker_timeout = absl::Seconds(f.worker_timeout_s);
  o.fail_on_worker_loss = f.on_worker_loss == "fail";
  o.elastic.reassign = f.on_worker_loss == "reassign";
  o.elastic.backup_blocks = f.backup_blocks;
  o.elastic.straggler_factor = f.straggler_factor;
  o.elastic.straggler_min_wait = absl::Milliseconds(f.straggler_min_wait_ms);
  o.elastic.start_wait = absl::Seconds(f.start_wait_s);
  o.update_threads = f.update_threads;
  o.exit_when_done = f.exit_when_done;
  o.shared_memory = f.shared_memory;
  o.shards = f.shards;
  o.shard = *shard;
  o.gather.addresses = *peers;

  // A write beyond a file-size limit must be an error, not a crash.
  signal(SIGXFSZ, SIG_IGN);
  // Before any thread starts, so that every thread inherits the mask.
  sigset_t signals;
  BlockStopSignals(&signals);
  KeepGrpcForTheProcess();  // starts gRPC's threads: after the mask

  // After the signal mask: building credentials starts gRPC's threads.
  absl::StatusOr<ServerSecurity> security = LoadServerSecurity(security_flags);
  if (!security.ok()) {
    Log("configuration error: %s", security.status().message());
    return kExitConfigError;
  }
  Log("security: %s", security->Describe());
  if (auto warning = PlaintextWarning(f.host, *security)) Log("%s", *warning);
  o.security = *std::move(security);
  if (f.shards > 1) {
    // Shard 0 calls the other shards as a client, with the same files.
    absl::StatusOr<ClientSecurity> client = LoadClientSecurity(security_flags);
    if (!client.ok()) {
      Log("configuration error: %s", client.status().message());
      return kExitConfigError;
    }
    o.gather.credentials = client->credentials;
    o.gather.auth_token = client->auth_token;
  }

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
