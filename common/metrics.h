// The metrics registry both roles build on (ServerMetrics in
// server/server_metrics.h, WorkerMetrics in worker/worker_metrics.h), and its
// HTTP exposition; the table in docs/monitoring.md lists every name.
// Conventions: prefix dp_, base units (seconds, bytes), counters end in _total,
// and the only labels are role ("ps" | "worker"), rank (workers, and dp-ps's
// per-rank series) and shard (every dp-ps series: which range of the
// parameters that process owns), plus reason on rejected requests (a status
// code name), version on dp_build_info and the backend's on
// dp_worker_backend_info, so the number of series is bounded by the number
// of workers and shards. Never a step or job id as a label.
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
class TcpRelay;
}  // namespace dp

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
  // The port scrapers connect to (IPv4 and IPv6 alike).
  int port() const { return port_; }

 private:
  friend class Metrics;
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                  std::unique_ptr<TcpRelay> ipv6, int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  // IPv6 clients reach exposer_ through it (see common/tcp_relay.h); null
  // when the address is IPv4 or the host has no IPv6.
  std::unique_ptr<TcpRelay> ipv6_;
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
  // one (see MetricsEndpoint::port). host is a name or address of this
  // machine, an IPv6 literal with or without brackets, or a wildcard:
  // "0.0.0.0" and "::" both listen on every IPv4 and IPv6 address, on the
  // same port, as gRPC does for dp-ps's --host (IPv4 only where the host has
  // no IPv6). UNAVAILABLE naming host:port when it cannot listen (port in
  // use, address not local).
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Serve(
      const std::string& host, int port,
      std::function<void()> before_scrape = nullptr);

  // Serialized size of tensor-carrying messages (Push, Pull, PushPull):
  // protobuf bytes, without HTTP/2 framing.
  void AddSentBytes(int64_t bytes);
  void AddReceivedBytes(int64_t bytes);

  // The exposition text a scrape would return now (tests, debugging); not
  // counted as a scrape.
  std::string Text();

  // Waits until the endpoint has served one more scrape, so that what was
  // set before the call reaches whoever scrapes (a job's final step and
  // accuracy, before the process exits). Waits only for a regular scraper:
  // after two scrapes at least, for at most 1.5 times the last interval
  // between two plus 1 s, and never longer than `cap`. True when one came.
  bool AwaitNextScrape(absl::Duration cap);

 protected:
  // role "ps" or "worker"; rank < 0 means no rank label, shard < 0 no shard
  // label.
  Metrics(const std::string& role, int rank, int shard = -1);
  // Refreshes derived gauges before every scrape.
  virtual void BeforeScrape() {}
  prometheus::Registry& registry() { return *registry_; }
  // The labels every family carries: role, rank for workers, shard for
  // dp-ps.
  const std::map<std::string, std::string>& constant_labels() const;
  // One series with the constant labels, in a family of its own. Seconds
  // histograms have buckets from 100 us to 60 s.
  prometheus::Gauge& NewGauge(const std::string& name, const std::string& help);
  prometheus::Counter& NewCounter(const std::string& name,
                                  const std::string& help);
  prometheus::Histogram& NewSeconds(const std::string& name,
                                    const std::string& help);
  // Families whose series the caller adds (with more labels, or later).
  prometheus::Family<prometheus::Gauge>& NewGaugeFamily(
      const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Counter>& NewCounterFamily(
      const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Histogram>& NewSecondsFamily(
      const std::string& name, const std::string& help);
  // The buckets of every seconds histogram.
  static const std::vector<double>& SecondsBuckets();
  // dp_training_loss, without a series yet: a 0 before the first value would
  // read as a loss.
  prometheus::Family<prometheus::Gauge>& NewLossFamily();

 private:
  class ScrapeHook;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeHook> hook_;
  std::map<std::string, std::string> labels_;
  prometheus::Counter* sent_bytes_;
  prometheus::Counter* received_bytes_;
};

}  // namespace dp

#endif  // DP_COMMON_METRICS_H_
