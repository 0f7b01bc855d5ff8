// The worker loop: learn the job from dp-ps, load the data it names, register,
// then per step: gradient of the local batch -> push -> barrier -> new weights.
// Rank 0 also evaluates the test set at the end of every epoch.
#ifndef DP_WORKER_TRAINER_H_
#define DP_WORKER_TRAINER_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "worker/backend.h"
#include "worker/backend_choice.h"
#include "worker/ps_client.h"

namespace dp {

struct TrainerOptions {
  int rank = 0;
  std::string data_dir;   // empty: the data set's default location
  BackendChoice backend;  // default: the CPU backend
  int cpu_threads = 1;
  bool tf32 = false;  // CUDA: TF32 tensor-core matrix products
  bool fused = true;  // PushPull instead of Push + Barrier + Pull
  // Read before every step: once true, Run returns CANCELLED, so a worker
  // asked to stop (SIGTERM) does so after the step in progress.
  const std::atomic<bool>* stop = nullptr;
  // Called once the worker has joined the job (data loaded, backend up,
  // registered, weights pulled): its readiness.
  std::function<void()> on_joined;
  WorkerMetrics* metrics = nullptr;  // not owned; null: an unexported one
};

struct TrainerStats {
  int64_t steps = 0;            // steps computed by this process
  int64_t resyncs = 0;          // ABORTED answers that made it re-register
  double compute_seconds = 0;   // forward + backward
  double exchange_seconds = 0;  // push, barrier wait, pull
  int64_t bytes_sent = 0;       // message payloads of the exchange
  int64_t bytes_received = 0;
};

class Trainer {
 public:
  Trainer(PsClient* client, TrainerOptions options);

  // OK when every step of the job is applied. FAILED_PRECONDITION and
  // INVALID_ARGUMENT mean a configuration problem (data, rank, fingerprint);
  // CANCELLED that options.stop was set.
  absl::Status Run();
  const TrainerStats& stats() const { return stats_; }

 private:
  PsClient* const client_;
  const TrainerOptions options_;
  TrainerStats stats_;
};

}  // namespace dp

#endif  // DP_WORKER_TRAINER_H_
