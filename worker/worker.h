// A dp-worker's parts: its backend choice, health port, metrics endpoint,
// dp-ps client and trainer, built in that order and torn down in reverse.
// main() parses flags, forwards signals to Stop and maps Run's status to
// the exit code; tests can run a worker in-process.
#ifndef DP_WORKER_WORKER_H_
#define DP_WORKER_WORKER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "proto/health_server.h"
#include "worker/backend_choice.h"
#include "worker/ps_group.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

namespace dp {

struct WorkerOptions {
  int rank = 0;
  std::string data_dir;
  BackendRequest backend;  // its rank is set from `rank`
  int cpu_threads = 1;
  bool tf32 = false;
  bool fused = true;
  int health_port = -1;  // -1 off, 0 any free port
  int metrics_port = 0;  // kMetricsOff, kMetricsAnyPort or a port
  std::string metrics_host = "0.0.0.0";
  PsClientOptions client;
  // Every dp-ps shard's address (one: an unsharded job).
  std::vector<std::string> ps_addresses;
};

class Worker {
 public:
  // The backend that cannot run keeps its code (FAILED_PRECONDITION,
  // NOT_FOUND: exit 2); a port that cannot be served on is UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(WorkerOptions options);

  // Trains until the job ends (OK), Stop() (CANCELLED) or an error.
  absl::Status Run();
  // From any thread: the trainer stops after its current step.
  void Stop() { stop_.store(true); }
  bool stopped() const { return stop_.load(); }

 private:
  explicit Worker(WorkerOptions options);

  const WorkerOptions options_;
  std::atomic<bool> stop_{false};
  BackendChoice backend_;
  std::unique_ptr<HealthServer> health_;
  WorkerMetrics metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::unique_ptr<PsGroup> client_;
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace dp

#endif  // DP_WORKER_WORKER_H_
