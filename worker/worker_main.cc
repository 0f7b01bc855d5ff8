// dp-worker: parses and checks flags, runs a Worker (worker/worker.h) until
// the job ends, forwards SIGTERM/SIGINT to it, and turns the result into the
// exit code.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/metrics.h"
#include "common/model_layout.h"
#include "common/security.h"
#include "common/shard_plan.h"
#include "worker/backend_choice.h"
#include "worker/exit_code.h"
#include "worker/worker.h"

namespace dp {
namespace {

// SIGTERM/SIGINT: the handler only writes the signal number to a pipe that
// a watcher thread reads. (sigwait would not do: OpenBLAS starts its threads
// before main, with the signals unblocked.)
int stop_pipe[2] = {-1, -1};
void OnStopSignal(int sig) {
  const char byte = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = write(stop_pipe[1], &byte, 1);
}

// "host:port" with a port in 1..65535 ("[v6]:port" too).
bool IsHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  return colon != std::string::npos && colon > 0 &&
         absl::SimpleAtoi(address.substr(colon + 1), &port) && port >= 1 &&
         port <= 65535;
}

int Run(int argc, char** argv) {
  std::string ps = "localhost:5000";
  int rank = -1;
  int shards = 0;
  std::string data_dir;
  std::string backend = "auto";
  int device = -1;
  std::string cuda_module;
  int metrics_port = 0;
  std::string metrics_host = "0.0.0.0";
  int threads = 1;
  bool tf32 = false;
  std::string protocol = "fused";
  std::string data_plane = "auto";
  int wait_timeout_s = 30;
  int retry_for_s = 120;
  int health_port = -1;
  int stop_timeout_s = 20;
  bool dry_run = false;
  Flags flags("dp-worker",
              "Worker of a dp-ps job: computes gradients on its data shard.");
  flags.AddString("ps", &ps,
                  "dp-ps address host:port; a sharded job's shards as a "
                  "comma-separated list, or one name that resolves to all "
                  "of them; an entry with {shard} stands for one per shard "
                  "(--shards of them)");
  flags.AddInt("shards", &shards,
               "how many dp-ps shards an entry of --ps with {shard} names "
               "(0 = none has it)");
  flags.AddInt("rank", &rank,
               "this worker's rank, 0..N-1 (-1: dp-ps picks one when it "
               "joins)",
               {"RANK", "JOB_COMPLETION_INDEX"});
  flags.AddString("data_dir", &data_dir,
                  "directory of the IDX files (empty: the data set's default)");
  flags.AddString("backend", &backend,
                  "auto | cpu | cuda (auto: cuda when the CUDA module is "
                  "installed and finds a GPU it has code for, else cpu)");
  flags.AddInt("device", &device,
               "CUDA device ordinal (-1: rank modulo the visible GPUs)",
               {"LOCAL_RANK"});
  flags.AddString("cuda_module", &cuda_module,
                  "path of libdp_cuda.so (empty: next to dp-worker, then "
                  "../lib/dp-ps/)");
  flags.AddInt("metrics_port", &metrics_port,
               "Prometheus metrics port (0 = off, -1 = any free port)");
  flags.AddString("metrics_host", &metrics_host,
                  "address the metrics endpoint listens on (0.0.0.0 or ::: "
                  "every IPv4 and IPv6 address; an IPv6 address with or "
                  "without brackets)");
  flags.AddInt("threads", &threads, "BLAS threads of the CPU backend");
  flags.AddBool("tf32", &tf32,
                "CUDA backend: allow TF32 tensor-core matrix products (off: "
                "exact float32)");
  flags.AddString("data_plane", &data_plane,
                  "auto | grpc | shm: how the step's tensors travel (auto: "
                  "shared memory when dp-ps is on this host and offers it, "
                  "else gRPC; shm: that or an error)");
  flags.AddString("protocol", &protocol,
                  "fused (PushPull, one round trip) | plain (Push, Barrier, "
                  "Pull)");
  flags.AddInt("wait_timeout_s", &wait_timeout_s,
               "deadline of one barrier wait; on expiry the worker says whom "
               "it waits for and waits again");
  flags.AddInt("retry_for_s", &retry_for_s,
               "how long to retry while dp-ps is unavailable");
  flags.AddInt("health_port", &health_port,
               "port of the grpc.health.v1 service: SERVING once joined "
               "(-1 = off, 0 = any free port)");
  flags.AddInt("stop_timeout_s", &stop_timeout_s,
               "on SIGTERM the worker stops after its current step; if that "
               "takes longer than this, it exits anyway");
  SecurityFlags security_flags;
  AddSecurityFlags(&flags, &security_flags, Side::kClient);
  if (std::optional<int> exit =
          ParseCommandLine(&flags, &dry_run, argc, argv)) {
    return *exit;
  }
  SetLogTag(rank >= 0 ? absl::StrFormat("worker %d", rank)
                      : absl::StrFormat("worker %d", getpid()));
  if (rank < -1) {
    Log("configuration error: --rank must be 0..N-1, or -1 for dp-ps to "
        "pick one (or DP_RANK, RANK, JOB_COMPLETION_INDEX), got %d",
        rank);
    return kExitConfigError;
  }
  if (data_plane != "auto" && data_plane != "grpc" && data_plane != "shm") {
    Log("configuration error: --data_plane must be auto, grpc or shm, got "
        "'%s'",
        data_plane);
    return kExitConfigError;
  }
  if (protocol != "fused" && protocol != "plain") {
    Log("configuration error: --protocol must be fused or plain, got '%s'",
        protocol);
    return kExitConfigError;
  }
  if (threads < 1 || wait_timeout_s < 1 || retry_for_s < 0 ||
      stop_timeout_s < 1) {
    Log("configuration error: --threads, --wait_timeout_s and "
        "--stop_timeout_s must be >= 1, --retry_for_s >= 0");
    return kExitConfigError;
  }
  // A dry run checks the name only: the manifests name the GPU backend,
  // and their check runs where there is no GPU.
  if (absl::Status s = CheckBackendName(backend); !s.ok()) {
    Log("configuration error: %s", s.message());
    return kExitConfigError;
  }
  absl::StatusOr<std::vector<std::string>> expanded =
      ExpandShardTemplate(ps, shards);
  if (!expanded.ok()) {
    Log("configuration error: --ps: %s", expanded.status().message());
    return kExitConfigError;
  }
  const std::vector<std::string>& entries = *expanded;
  if (entries.empty() ||
      !std::all_of(entries.begin(), entries.end(), IsHostPort)) {
    Log("configuration error: --ps must be host:port or a comma-separated "
        "list of them, got '%s'",
        ps);
    return kExitConfigError;
  }
  if (health_port < -1 || health_port > 65535) {
    Log("configuration error: --health_port must be in -1..65535, got %d",
        health_port);
    return kExitConfigError;
  }
  if (absl::Status s = ValidateMetricsPort(metrics_port); !s.ok()) {
    Log("configuration error: %s", s.message());
    return kExitConfigError;
  }
  if (dry_run) return FinishDryRun(flags);
  WarnUnknownEnvironment(flags);
  auto security = LoadClientSecurity(security_flags);
  if (!security.ok()) {
    Log("configuration error: %s", security.status().message());
    return kExitConfigError;
  }
  Log("dp-worker %s starting: %s", DP_VERSION, flags.Effective());
  Log("security: %s", security->Describe());

  WorkerOptions o;
  o.rank = rank;
  o.data_dir = data_dir;
  o.backend.name = backend;
  o.backend.device = device;
  o.backend.cuda_module = cuda_module;
  o.cpu_threads = threads;
  o.tf32 = tf32;
  o.fused = protocol == "fused";
  o.client.data_plane = data_plane == "grpc"  ? DataPlane::kGrpc
                        : data_plane == "shm" ? DataPlane::kShm
                                              : DataPlane::kAuto;
  o.health_port = health_port;
  o.metrics_port = metrics_port;
  o.metrics_host = metrics_host;
  o.client.address = ps;
  o.ps_addresses = ExpandPsAddresses(absl::StrJoin(entries, ","));
  o.client.wait_timeout = absl::Seconds(wait_timeout_s);
  o.client.retry_for = absl::Seconds(retry_for_s);
  o.client.max_message_bytes =
      MessageBytesFor(ModelLayout::SimpleNet().num_params());
  o.client.credentials = security->credentials;
  o.client.tls_server_name = security->server_name;
  o.client.auth_token = security->auth_token;

  if (pipe(stop_pipe) != 0) {
    Log("error: pipe: %s", std::strerror(errno));
    return kExitFailure;
  }
  struct sigaction on_stop = {};
  on_stop.sa_handler = OnStopSignal;
  on_stop.sa_flags = SA_RESTART;
  sigemptyset(&on_stop.sa_mask);
  sigaction(SIGTERM, &on_stop, nullptr);
  sigaction(SIGINT, &on_stop, nullptr);

  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Start(o);
  if (!worker.ok()) {
    const int code = WorkerExitCode(worker.status(), /*stopped=*/false);
    Log("%s: %s",
        code == kExitConfigError     ? "configuration error"
        : code == kExitCannotRunHere ? "cannot run on this node"
                                     : "error",
        worker.status().message());
    return code;
  }
  // Joined before the worker goes, so it never outlives what it uses; a
  // byte 0 on the pipe tells it to return. (A signal that came earlier
  // waits in the pipe.)
  absl::Notification finished;
  std::thread watcher([w = worker->get(), &finished, stop_timeout_s] {
    char sig = 0;
    while (read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;
    Log("signal %d: stopping after the current step", sig);
    w->Stop();
    if (!finished.WaitForNotificationWithTimeout(
            absl::Seconds(stop_timeout_s))) {
      Log("the current step did not end within %d s; exiting", stop_timeout_s);
      std::_Exit(kExitInterrupted);
    }
  });
  const absl::Status s = (*worker)->Run();
  finished.Notify();
  const char exit_watcher = 0;
  [[maybe_unused]] ssize_t n = write(stop_pipe[1], &exit_watcher, 1);
  watcher.join();
  const bool stopped = (*worker)->stopped();
  worker->reset();
  const int code = WorkerExitCode(s, stopped);
  if (code == kExitInterrupted) {
    if (s.code() != absl::StatusCode::kCancelled)
      Log("stopped: %s", s.ToString());
  } else if (IsJobFailed(s)) {
    Log("%s", s.message());  // "the job failed: <dp-ps's reason>"
  } else if (!s.ok()) {
    Log("error: %s (exit %d)", s.ToString(), code);
  }
  return code;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  dp::KeepLargeBuffersInHeap();
  dp::KeepGrpcForTheProcess();
  return dp::Run(argc, argv);
}
