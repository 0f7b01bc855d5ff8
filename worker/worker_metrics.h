// What a dp-worker exports to Prometheus: its step, compute and call times,
// samples, local loss, waits, re-syncs and backend (docs/monitoring.md).
#ifndef DP_WORKER_WORKER_METRICS_H_
#define DP_WORKER_WORKER_METRICS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "common/metrics.h"

namespace dp {

class WorkerMetrics final : public Metrics {
 public:
  explicit WorkerMetrics(int rank);

  enum class Call { kPull, kPush, kBarrier, kPushPull };
  // One call to dp-ps as the worker saw it, retries and waiting included.
  void ObserveCall(Call call, absl::Duration d);
  // Forward + backward of the local batch and its mean loss. Call from one
  // thread (the trainer's).
  void ObserveCompute(absl::Duration d, double loss);
  // A step is complete (new weights in hand): its wall time and samples.
  void ObserveStep(absl::Duration d, int64_t samples);
  // dp-ps answered ABORTED (stale or future step) and the worker re-joined.
  void CountResync();
  void CountCatchUp();
  // A barrier wait outlasted --wait_timeout_s: the worker said whom it
  // waited for and waited again, without computing the step again.
  void CountWaitTimeout();
  // dp_worker_backend_info{labels...} 1: which backend and device this
  // worker computes on (backend="cpu", or "cuda" with device, gpu and
  // compute_capability). Call once.
  void SetBackend(const std::map<std::string, std::string>& labels);
  // dp_worker_shared_memory: 1 while the step's tensors go through shared
  // memory, 0 through gRPC. The series appears with the first call, once the
  // worker has joined and knows its plane. Call from the trainer's thread.
  void SetSharedMemory(bool on);

 private:
  prometheus::Histogram* calls_[4];
  prometheus::Histogram* compute_seconds_;
  prometheus::Histogram* step_seconds_;
  prometheus::Counter* samples_;
  prometheus::Counter* resyncs_;
  prometheus::Counter* catch_ups_;
  prometheus::Counter* wait_timeouts_;
  // Created with the first SetSharedMemory, from the trainer's thread only.
  prometheus::Family<prometheus::Gauge>* shared_memory_family_;
  prometheus::Gauge* shared_memory_ = nullptr;
  // Created with the first loss, from the trainer's thread only.
  prometheus::Family<prometheus::Gauge>* loss_family_;
  prometheus::Gauge* loss_ = nullptr;
};

}  // namespace dp

#endif  // DP_WORKER_WORKER_METRICS_H_
