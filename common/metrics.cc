// The metrics registry, dp-ps's metrics and the HTTP exposition, over
// prometheus-cpp.
#include "common/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <exception>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/tcp_relay.h"

namespace dp {
namespace {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;
using prometheus::Registry;

// 100 us .. 60 s: an update on a CPU takes ~1 ms, a step tens of ms, and a
// barrier wait can reach --wait_timeout_s (30 s by default).
const Histogram::BucketBoundaries& SecondsBucketBoundaries() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *buckets;
}

// The family `builder` (prometheus::BuildGauge() and the like) makes,
// registered in `r` under `name` with the process's labels.
template <typename Builder>
auto& Registered(Builder builder, Registry& r, const Labels& labels,
                 const std::string& name, const std::string& help) {
  return builder.Name(name).Help(help).Labels(labels).Register(r);
}

Gauge& AddGauge(Registry& r, const Labels& labels, const std::string& name,
                const std::string& help) {
  return Registered(prometheus::BuildGauge(), r, labels, name, help).Add({});
}

Counter& AddCounter(Registry& r, const Labels& labels, const std::string& name,
                    const std::string& help) {
  return Registered(prometheus::BuildCounter(), r, labels, name, help).Add({});
}

prometheus::Family<Histogram>& SecondsFamily(Registry& r, const Labels& labels,
                                             const std::string& name,
                                             const std::string& help) {
  return Registered(prometheus::BuildHistogram(), r, labels, name, help);
}

Histogram& AddSeconds(Registry& r, const Labels& labels,
                      const std::string& name, const std::string& help) {
  return SecondsFamily(r, labels, name, help)
      .Add({}, SecondsBucketBoundaries());
}

// Both roles export the loss under one name; role tells them apart. The
// series appears with the first value: a 0 before that would read as a loss.
prometheus::Family<Gauge>& LossFamily(Registry& r, const Labels& labels) {
  return Registered(prometheus::BuildGauge(), r, labels, "dp_training_loss",
                    "Training loss (mean cross-entropy) of the last step: the "
                    "mean over the ranks on dp-ps, the local batch's on a "
                    "worker.");
}

}  // namespace

absl::Status ValidateMetricsPort(int port) {
  if (port < kMetricsAnyPort || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--metrics_port must be 0 (off), -1 (any free port) or 1..65535, "
        "got %d",
        port));
  }
  return absl::OkStatus();
}

// Runs the refresh hooks, then hands out the registry's families. The
// exposer holds it by weak_ptr, so a scrape after ~Metrics finds nothing.
class Metrics::ScrapeHook final : public prometheus::Collectable {
 public:
  ScrapeHook(Metrics* owner, std::shared_ptr<Registry> registry)
      : owner_(owner), registry_(std::move(registry)) {}

  void SetBeforeScrape(std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    before_scrape_ = std::move(f);
  }

  // A scrape: the exposer calls this for every GET /metrics.
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = Refresh();
    absl::MutexLock lock(&mu_);
    ++scrapes_;
    previous_scrape_ = last_scrape_;
    last_scrape_ = absl::Now();
    return families;
  }

  // The families as they are now, hooks run.
  std::vector<prometheus::MetricFamily> Refresh() const {
    owner_->BeforeScrape();
    std::function<void()> before;
    {
      absl::MutexLock lock(&mu_);
      before = before_scrape_;
    }
    if (before) before();
    return registry_->Collect();
  }

  bool AwaitNextScrape(absl::Duration cap) const {
    absl::MutexLock lock(&mu_);
    if (scrapes_ < 2) return false;  // no regular scraper to wait for
    const absl::Duration wait = std::min(
        cap, (last_scrape_ - previous_scrape_) * 1.5 + absl::Seconds(1));
    const NextScrape next{this, scrapes_};
    return mu_.AwaitWithTimeout(absl::Condition(&next), wait);
  }

 private:
  struct NextScrape {
    const ScrapeHook* hook;
    int64_t seen;
    bool operator()() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(hook->mu_) {
      return hook->scrapes_ > seen;
    }
  };

  Metrics* const owner_;
  const std::shared_ptr<Registry> registry_;
  mutable absl::Mutex mu_;
  std::function<void()> before_scrape_ ABSL_GUARDED_BY(mu_);
  mutable int64_t scrapes_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Time last_scrape_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time previous_scrape_ ABSL_GUARDED_BY(mu_);
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                                 std::unique_ptr<TcpRelay> ipv6, int port)
    : exposer_(std::move(exposer)), ipv6_(std::move(ipv6)), port_(port) {}

// The relay first: it connects to the exposer.
MetricsEndpoint::~MetricsEndpoint() { ipv6_.reset(); }

Metrics::Metrics(const std::string& role, int rank, int shard)
    : registry_(std::make_shared<Registry>()),
      hook_(std::make_shared<ScrapeHook>(this, registry_)) {
  labels_["role"] = role;
  if (rank >= 0) labels_["rank"] = absl::StrCat(rank);
  if (shard >= 0) labels_["shard"] = absl::StrCat(shard);
  prometheus::BuildGauge()
      .Name("dp_build_info")
      .Help("Always 1; labels say which version of dp-ps this process runs.")
      .Labels(labels_)
      .Register(*registry_)
      .Add({{"version", DP_VERSION}})
      .Set(1);
  sent_bytes_ = &AddCounter(
      *registry_, labels_, "dp_sent_bytes_total",
      "Serialized bytes of tensor messages sent (gradients by workers, "
      "weights by dp-ps), without HTTP/2 framing.");
  received_bytes_ = &AddCounter(
      *registry_, labels_, "dp_received_bytes_total",
      "Serialized bytes of tensor messages received (weights by workers, "
      "gradients by dp-ps), without HTTP/2 framing.");
}

Metrics::~Metrics() = default;

const std::map<std::string, std::string>& Metrics::constant_labels() const {
  return labels_;
}

Gauge& Metrics::NewGauge(const std::string& name, const std::string& help) {
  return AddGauge(*registry_, labels_, name, help);
}

Counter& Metrics::NewCounter(const std::string& name, const std::string& help) {
  return AddCounter(*registry_, labels_, name, help);
}

prometheus::Family<Gauge>& Metrics::NewGaugeFamily(const std::string& name,
                                                   const std::string& help) {
  return Registered(prometheus::BuildGauge(), *registry_, labels_, name, help);
}

prometheus::Family<Counter>& Metrics::NewCounterFamily(
    const std::string& name, const std::string& help) {
  return Registered(prometheus::BuildCounter(), *registry_, labels_, name,
                    help);
}

prometheus::Family<Histogram>& Metrics::NewSecondsFamily(
    const std::string& name, const std::string& help) {
  return SecondsFamily(*registry_, labels_, name, help);
}

const std::vector<double>& Metrics::SecondsBuckets() {
  return SecondsBucketBoundaries();
}

Histogram& Metrics::NewSeconds(const std::string& name,
                               const std::string& help) {
  return AddSeconds(*registry_, labels_, name, help);
}

prometheus::Family<Gauge>& Metrics::NewLossFamily() {
  return LossFamily(*registry_, labels_);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Metrics::Serve(
    const std::string& host, int port, std::function<void()> before_scrape) {
  if (absl::Status s = ValidateMetricsPort(port); !s.ok()) return s;
  if (port == kMetricsOff) {
    return absl::InvalidArgumentError("metrics are off (--metrics_port=0)");
  }
  const int wanted = port == kMetricsAnyPort ? 0 : port;
  // civetweb listens on IPv4 only (common/tcp_relay.h): an IPv6 address is
  // served by a relay to civetweb on the loopback, a wildcard by civetweb
  // on every IPv4 address plus a relay on every IPv6 one, on its port.
  const std::string ipv6_host(
      absl::StripSuffix(absl::StripPrefix(host, "["), "]"));
  const bool wildcard = host == "0.0.0.0" || ipv6_host == "::";
  const bool ipv6 = absl::StrContains(ipv6_host, ':');
  const std::string address = absl::StrCat(
      ipv6 ? absl::StrCat("[", ipv6_host, "]") : host, ":", wanted);
  const auto cannot_listen = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot serve metrics on %s: the port is in use or the address is "
        "not a local address or host name (%s)",
        address, why));
  };
  if (host.empty()) return cannot_listen("empty --metrics_host");
  const bool ipv6_only = ipv6 && !wildcard;
  const std::string civetweb_address =
      wildcard    ? absl::StrCat("0.0.0.0:", wanted)
      : ipv6_only ? std::string("127.0.0.1:0")
                  : absl::StrCat(host, ":", wanted);
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed bind by throwing; nothing else here does.
  try {
    exposer = std::make_unique<prometheus::Exposer>(civetweb_address,
                                                    /*num_threads=*/2);
  } catch (const std::exception& e) {
    return cannot_listen(e.what());
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) return cannot_listen("no port bound");
  int served_port = ports[0];
  std::unique_ptr<TcpRelay> relay;
  if (wildcard || ipv6_only) {
    absl::StatusOr<std::unique_ptr<TcpRelay>> started = TcpRelay::Start(
        wildcard ? "::" : ipv6_host, wildcard ? served_port : wanted, ports[0]);
    // A wildcard on a host without IPv6 serves IPv4 alone.
    const bool no_ipv6 =
        started.status().code() == absl::StatusCode::kFailedPrecondition;
    if (!started.ok() && !(wildcard && no_ipv6)) {
      return cannot_listen(started.status().message());
    }
    if (started.ok()) {
      relay = std::move(*started);
      served_port = relay->port();
    }
  }
  hook_->SetBeforeScrape(std::move(before_scrape));
  exposer->RegisterCollectable(hook_);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), std::move(relay), served_port));
}

void Metrics::AddSentBytes(int64_t bytes) {
  sent_bytes_->Increment(static_cast<double>(bytes));
}

void Metrics::AddReceivedBytes(int64_t bytes) {
  received_bytes_->Increment(static_cast<double>(bytes));
}

std::string Metrics::Text() {
  return prometheus::TextSerializer().Serialize(hook_->Refresh());
}

bool Metrics::AwaitNextScrape(absl::Duration cap) {
  return hook_->AwaitNextScrape(cap);
}

}  // namespace dp
