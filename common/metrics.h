// What dp-ps and dp-worker export to Prometheus, in one place (the README's
// "Monitoring" table lists the same names). Conventions: prefix dp_, base
// units (seconds, bytes), counters end in _total, and the only labels are
// role ("ps" | "worker") and rank, plus reason on rejected requests (a status
// code name) and version on dp_build_info, so the number of series is
// bounded by the number of workers. Never a step or job id as a label.
//
// No gRPC types and no training math here: callers hand in durations, byte
// counts and values they already have. Recording is lock-free (atomics in
// prometheus-cpp) and always on; Serve() only decides whether anyone can
// scrape it.
#ifndef DP_COMMON_METRICS_H_
#define DP_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace dp {

// --metrics_port values: 0 turns metrics off, -1 picks any free port (tests,
// several processes on one machine), else the port itself.
inline constexpr int kMetricsOff = 0;
inline constexpr int kMetricsAnyPort = -1;

// INVALID_ARGUMENT naming the flag unless port is -1..65535.
absl::Status ValidateMetricsPort(int port);

// An HTTP server answering GET /metrics; stops serving when destroyed. Once
// it has served a scrape, destruction takes about 2 s (civetweb's listener
// wakes up in steps of that length), which delays the process's exit.
class MetricsEndpoint {
 public:
  ~MetricsEndpoint();
  int port() const { return port_; }

 private:
  friend class Metrics;
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

// The registry of one process: dp_build_info and the byte counters that both
// roles have. ServerMetrics and WorkerMetrics add the rest.
class Metrics {
 public:
  virtual ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves GET http://host:port/metrics until the endpoint is destroyed.
  // `before_scrape` (may be empty) runs on the HTTP thread at the start of
  // every scrape, so gauges that mirror state kept elsewhere are current; the
  // endpoint must be destroyed before whatever it reads. port -1 picks a free
  // one (see MetricsEndpoint::port). UNAVAILABLE naming host:port when it
  // cannot listen (port in use, address not local or not IPv4).
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Serve(
      const std::string& host, int port,
      std::function<void()> before_scrape = nullptr);

  // Serialized size of tensor-carrying messages (Push, Pull, PushPull):
  // protobuf bytes, without HTTP/2 framing.
  void AddSentBytes(int64_t bytes);
  void AddReceivedBytes(int64_t bytes);

  // The exposition text a scrape would return now (tests, debugging).
  std::string Text();

 protected:
  // role "ps" or "worker"; rank < 0 means no rank label.
  Metrics(const std::string& role, int rank);
  // Refreshes derived gauges before every scrape.
  virtual void BeforeScrape() {}
  prometheus::Registry& registry() { return *registry_; }
  // The labels every family carries: role, and rank for workers.
  const std::map<std::string, std::string>& constant_labels() const;

 private:
  class ScrapeHook;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeHook> hook_;
  std::map<std::string, std::string> labels_;
  prometheus::Counter* sent_bytes_;
  prometheus::Counter* received_bytes_;
};

// dp-ps: training progress, workers, rejections, update and barrier times.
class ServerMetrics final : public Metrics {
 public:
  // world_size fixes the rank labels (0..world_size-1). A rank counts as
  // active while it made a request within `active_window`: a worker waiting
  // at the barrier re-asks every --wait_timeout_s (30 s by default), so the
  // window must be longer than that.
  explicit ServerMetrics(int world_size,
                         absl::Duration active_window = absl::Seconds(60),
                         std::function<absl::Time()> now = absl::Now);

  // A request naming `rank` arrived. Ranks outside 0..world_size-1 are
  // ignored: a bad request must not create a series.
  void SawRank(int rank);
  // A request finished with `code`. OK and CANCELLED (the client gave up,
  // e.g. its barrier deadline passed) are not rejections.
  void CountRejected(absl::StatusCode code);
  // From a rank's arrival at the barrier (its push, for PushPull) to the
  // update that released it. The slowest rank waits least.
  void ObserveBarrierWait(int rank, absl::Duration wait);
  // Averaging the N gradients plus the Adam step.
  void ObserveUpdate(absl::Duration apply);

  // State kept by the coordinator, mirrored at scrape time.
  struct Progress {
    int64_t step = 0;           // updates applied
    int64_t planned_steps = 0;  // 0 until the data set size is known
    int epoch = 0;              // 1-based epoch of the next step; 0 unknown
    bool has_loss = false;
    double loss = 0.0;  // mean of the ranks' losses of the last step
    bool has_eval = false;
    double test_accuracy = 0.0;
    double test_loss = 0.0;
    int registered_workers = 0;
  };
  void SetProgress(const Progress& p);

  // Ranks seen within the active window, now.
  int ActiveWorkers() const;

 private:
  void BeforeScrape() override;

  const int world_size_;
  const absl::Duration active_window_;
  const std::function<absl::Time()> now_;
  // Unix nanoseconds of each rank's latest request; INT64_MIN = never.
  std::unique_ptr<std::atomic<int64_t>[]> last_seen_;
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Gauge* step_;
  prometheus::Gauge* planned_steps_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* expected_workers_;
  prometheus::Gauge* registered_workers_;
  prometheus::Gauge* active_workers_;
  prometheus::Histogram* update_seconds_;
  std::vector<prometheus::Histogram*> barrier_wait_;  // by rank
  // By absl::StatusCode value, all created at 0 so that rate() works from
  // the first scrape; the label set is the fixed list of code names.
  std::vector<prometheus::Counter*> rejected_;
  // Their series appear with the first evaluation: a 0 before that would
  // read as "0% accuracy".
  prometheus::Family<prometheus::Gauge>* test_accuracy_;
  prometheus::Family<prometheus::Gauge>* test_loss_;
};

// dp-worker: its step, compute and call times, samples and local loss.
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
  // dp_worker_backend_info{labels...} 1: which backend and device this
  // worker computes on (backend="cpu", or "cuda" with device, gpu and
  // compute_capability). Call once.
  void SetBackend(const std::map<std::string, std::string>& labels);

 private:
  prometheus::Histogram* calls_[4];
  prometheus::Histogram* compute_seconds_;
  prometheus::Histogram* step_seconds_;
  prometheus::Counter* samples_;
  prometheus::Counter* resyncs_;
  // Created with the first loss, from the trainer's thread only.
  prometheus::Family<prometheus::Gauge>* loss_family_;
  prometheus::Gauge* loss_ = nullptr;
};

}  // namespace dp

#endif  // DP_COMMON_METRICS_H_
