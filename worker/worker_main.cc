// dp-worker: parses flags, connects to dp-ps and trains until the job ends.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/metrics.h"
#include "common/model_layout.h"
#include "worker/backend.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

namespace dp {
namespace {

bool IsConfigurationError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kNotFound ||
         s.code() == absl::StatusCode::kDataLoss;
}

int Run(int argc, char** argv) {
  std::string ps = "localhost:5000";
  int rank = -1;
  std::string data_dir;
  std::string backend = "auto";
  int metrics_port = 0;
  std::string metrics_host = "0.0.0.0";
  int threads = 1;
  bool tf32 = false;
  std::string protocol = "fused";
  int wait_timeout_s = 30;
  int retry_for_s = 120;
  Flags flags("dp-worker",
              "Worker of a dp-ps job: computes gradients on its data shard.");
  flags.AddString("ps", &ps, "dp-ps address host:port");
  flags.AddInt("rank", &rank, "this worker's rank, 0..N-1",
               {"RANK", "JOB_COMPLETION_INDEX"});
  flags.AddString("data_dir", &data_dir,
                  "directory of the IDX files (empty: the data set's default)");
  flags.AddString("backend", &backend, "auto | cpu | cuda");
  flags.AddInt("metrics_port", &metrics_port,
               "Prometheus metrics port (0 = off, -1 = any free port)");
  flags.AddString("metrics_host", &metrics_host,
                  "address the metrics endpoint listens on");
  flags.AddInt("threads", &threads, "BLAS threads of the CPU backend");
  flags.AddBool("tf32", &tf32,
                "CUDA backend: allow TF32 tensor-core matrix products (off: "
                "exact float32)");
  flags.AddString("protocol", &protocol,
                  "fused (PushPull, one round trip) | plain (Push, Barrier, "
                  "Pull)");
  flags.AddInt("wait_timeout_s", &wait_timeout_s,
               "deadline of one barrier wait; on expiry the worker says whom "
               "it waits for and waits again");
  flags.AddInt("retry_for_s", &retry_for_s,
               "how long to retry while dp-ps is unavailable");
  auto action = flags.Parse(argc, argv);
  if (!action.ok()) {
    std::fprintf(stderr, "%s\n", std::string(action.status().message()).c_str());
    return kExitConfigError;
  }
  if (*action == Flags::Action::kExit) return kExitOk;
  SetLogTag(absl::StrFormat("worker %d", rank));
  if (rank < 0) {
    Log("configuration error: --rank is required (or DP_RANK, RANK, "
        "JOB_COMPLETION_INDEX)");
    return kExitConfigError;
  }
  if (protocol != "fused" && protocol != "plain") {
    Log("configuration error: --protocol must be fused or plain, got '%s'",
        protocol);
    return kExitConfigError;
  }
  if (threads < 1 || wait_timeout_s < 1 || retry_for_s < 0) {
    Log("configuration error: --threads and --wait_timeout_s must be >= 1, "
        "--retry_for_s >= 0");
    return kExitConfigError;
  }
  if (absl::Status s = CheckBackend(backend); !s.ok()) {
    Log("configuration error: %s", s.message());
    return kExitConfigError;
  }
  if (absl::Status s = ValidateMetricsPort(metrics_port); !s.ok()) {
    Log("configuration error: %s", s.message());
    return kExitConfigError;
  }
  Log("dp-worker %s starting: %s", DP_VERSION, flags.Effective());

  WorkerMetrics metrics(rank);
  std::unique_ptr<MetricsEndpoint> metrics_endpoint;
  if (metrics_port != kMetricsOff) {
    auto endpoint = metrics.Serve(metrics_host, metrics_port);
    if (!endpoint.ok()) {
      Log("error: %s", endpoint.status().message());
      return kExitFailure;
    }
    metrics_endpoint = std::move(*endpoint);
    Log("metrics on %s:%d", metrics_host, metrics_endpoint->port());
  }

  PsClientOptions client_options;
  client_options.address = ps;
  client_options.wait_timeout = absl::Seconds(wait_timeout_s);
  client_options.retry_for = absl::Seconds(retry_for_s);
  client_options.max_message_bytes =
      MessageBytesFor(ModelLayout::SimpleNet().num_params());
  PsClient client(client_options);
  TrainerOptions options;
  options.rank = rank;
  options.data_dir = data_dir;
  options.backend = backend;
  options.cpu_threads = threads;
  options.tf32 = tf32;
  options.fused = protocol == "fused";
  options.metrics = &metrics;
  Trainer trainer(&client, options);
  absl::Status s = trainer.Run();
  if (!s.ok()) {
    Log("error: %s", s.ToString());
    return IsConfigurationError(s) ? kExitConfigError : kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace dp

int main(int argc, char** argv) {
  dp::KeepLargeBuffersInHeap();
  return dp::Run(argc, argv);
}
