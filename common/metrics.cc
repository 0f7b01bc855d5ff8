// Prometheus metrics of dp-ps and dp-worker over prometheus-cpp.
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
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace dp {
namespace {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;
using prometheus::Registry;

// 100 us .. 60 s: an update on a CPU takes ~1 ms, a step tens of ms, and a
// barrier wait can reach --wait_timeout_s (30 s by default).
const Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* buckets = new Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
  return *buckets;
}

constexpr int kNumStatusCodes =
    17;  // absl::StatusCode::kOk .. kUnauthenticated

// "invalid_argument" for kInvalidArgument: the bounded label value set.
std::string ReasonOf(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  if (c <= 0 || c >= kNumStatusCodes) code = absl::StatusCode::kUnknown;
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

Gauge& AddGauge(Registry& r, const Labels& labels, const std::string& name,
                const std::string& help) {
  return prometheus::BuildGauge()
      .Name(name)
      .Help(help)
      .Labels(labels)
      .Register(r)
      .Add({});
}

Counter& AddCounter(Registry& r, const Labels& labels, const std::string& name,
                    const std::string& help) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Labels(labels)
      .Register(r)
      .Add({});
}

prometheus::Family<Histogram>& SecondsFamily(Registry& r, const Labels& labels,
                                             const std::string& name,
                                             const std::string& help) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Labels(labels)
      .Register(r);
}

Histogram& AddSeconds(Registry& r, const Labels& labels,
                      const std::string& name, const std::string& help) {
  return SecondsFamily(r, labels, name, help).Add({}, SecondsBuckets());
}

int64_t UnixNanos(absl::Time t) { return absl::ToUnixNanos(t); }

// Both roles export the loss under one name; role tells them apart. The
// series appears with the first value: a 0 before that would read as a loss.
prometheus::Family<Gauge>& LossFamily(Registry& r, const Labels& labels) {
  return prometheus::BuildGauge()
      .Name("dp_training_loss")
      .Help(
          "Training loss (mean cross-entropy) of the last step: the mean "
          "over the ranks on dp-ps, the local batch's on a worker.")
      .Labels(labels)
      .Register(r);
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

  std::vector<prometheus::MetricFamily> Collect() const override {
    owner_->BeforeScrape();
    std::function<void()> before;
    {
      absl::MutexLock lock(&mu_);
      before = before_scrape_;
    }
    if (before) before();
    return registry_->Collect();
  }

 private:
  Metrics* const owner_;
  const std::shared_ptr<Registry> registry_;
  mutable absl::Mutex mu_;
  std::function<void()> before_scrape_ ABSL_GUARDED_BY(mu_);
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                                 int port)
    : exposer_(std::move(exposer)), port_(port) {}

MetricsEndpoint::~MetricsEndpoint() = default;

Metrics::Metrics(const std::string& role, int rank)
    : registry_(std::make_shared<Registry>()),
      hook_(std::make_shared<ScrapeHook>(this, registry_)) {
  labels_["role"] = role;
  if (rank >= 0) labels_["rank"] = absl::StrCat(rank);
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

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Metrics::Serve(
    const std::string& host, int port, std::function<void()> before_scrape) {
  if (absl::Status s = ValidateMetricsPort(port); !s.ok()) return s;
  if (port == kMetricsOff) {
    return absl::InvalidArgumentError("metrics are off (--metrics_port=0)");
  }
  const std::string address =
      absl::StrFormat("%s:%d", host, port == kMetricsAnyPort ? 0 : port);
  const auto cannot_listen = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot serve metrics on %s: the port is in use or the address is "
        "not a local IPv4 address or host name (%s)",
        address, why));
  };
  if (host.empty()) return cannot_listen("empty --metrics_host");
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed bind by throwing; nothing else here does.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address,
                                                    /*num_threads=*/2);
  } catch (const std::exception& e) {
    return cannot_listen(e.what());
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) return cannot_listen("no port bound");
  hook_->SetBeforeScrape(std::move(before_scrape));
  exposer->RegisterCollectable(hook_);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), ports[0]));
}

void Metrics::AddSentBytes(int64_t bytes) {
  sent_bytes_->Increment(static_cast<double>(bytes));
}

void Metrics::AddReceivedBytes(int64_t bytes) {
  received_bytes_->Increment(static_cast<double>(bytes));
}

std::string Metrics::Text() {
  return prometheus::TextSerializer().Serialize(hook_->Collect());
}

ServerMetrics::ServerMetrics(int world_size, absl::Duration active_window,
                             std::function<absl::Time()> now)
    : Metrics("ps", -1),
      world_size_(world_size),
      active_window_(active_window),
      now_(std::move(now)),
      last_seen_(new std::atomic<int64_t>[std::max(world_size, 0)]) {
  for (int r = 0; r < world_size_; ++r) {
    last_seen_[r].store(std::numeric_limits<int64_t>::min());
  }
  Registry& reg = registry();
  const Labels& labels = constant_labels();
  loss_ = &LossFamily(reg, labels);
  step_ = &AddGauge(reg, labels, "dp_training_step",
                    "Updates applied so far, i.e. the version of the weights.");
  planned_steps_ =
      &AddGauge(reg, labels, "dp_training_planned_steps",
                "Steps the job will run (0 until the first worker registers).");
  epoch_ =
      &AddGauge(reg, labels, "dp_training_epoch",
                "1-based epoch of the step being trained (0 until known).");
  expected_workers_ = &AddGauge(reg, labels, "dp_ps_expected_workers",
                                "Workers the job needs (--workers).");
  registered_workers_ = &AddGauge(reg, labels, "dp_ps_registered_workers",
                                  "Ranks that have registered at least once.");
  active_workers_ =
      &AddGauge(reg, labels, "dp_ps_active_workers",
                absl::StrFormat("Ranks that made a request in the last %s.",
                                absl::FormatDuration(active_window_)));
  expected_workers_->Set(world_size_);
  update_seconds_ =
      &AddSeconds(reg, labels, "dp_ps_update_duration_seconds",
                  "Time dp-ps takes to apply one update (rank-ordered "
                  "average of the gradients plus the Adam step).");
  auto& barrier = SecondsFamily(
      reg, labels, "dp_ps_barrier_wait_duration_seconds",
      "Per rank, from its arrival at the barrier (its push, for PushPull) "
      "to the update that releases it; the slowest rank waits least.");
  for (int r = 0; r < world_size_; ++r) {
    barrier_wait_.push_back(
        &barrier.Add({{"rank", absl::StrCat(r)}}, SecondsBuckets()));
  }
  auto& rejected =
      prometheus::BuildCounter()
          .Name("dp_ps_rejected_requests_total")
          .Help(
              "Requests dp-ps refused, by status code (reason); a client "
              "cancelling its own wait is not counted.")
          .Labels(labels)
          .Register(reg);
  rejected_.assign(kNumStatusCodes, nullptr);
  for (int c = 1; c < kNumStatusCodes; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (code == absl::StatusCode::kCancelled) continue;
    rejected_[c] = &rejected.Add({{"reason", ReasonOf(code)}});
  }
  test_accuracy_ = &prometheus::BuildGauge()
                        .Name("dp_test_accuracy")
                        .Help(
                            "Fraction of the test set classified correctly "
                            "by the latest evaluated weights (rank 0 "
                            "evaluates after every epoch).")
                        .Labels(labels)
                        .Register(reg);
  test_loss_ = &prometheus::BuildGauge()
                    .Name("dp_test_loss")
                    .Help(
                        "Mean cross-entropy over the test set of the "
                        "latest evaluated weights.")
                    .Labels(labels)
                    .Register(reg);
}

void ServerMetrics::SawRank(int rank) {
  if (rank < 0 || rank >= world_size_) return;
  last_seen_[rank].store(UnixNanos(now_()), std::memory_order_relaxed);
}

void ServerMetrics::CountRejected(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk || code == absl::StatusCode::kCancelled) {
    return;
  }
  int c = static_cast<int>(code);
  if (c <= 0 || c >= kNumStatusCodes) {
    c = static_cast<int>(absl::StatusCode::kUnknown);
  }
  rejected_[c]->Increment();
}

void ServerMetrics::ObserveBarrierWait(int rank, absl::Duration wait) {
  if (rank < 0 || rank >= world_size_) return;
  barrier_wait_[rank]->Observe(absl::ToDoubleSeconds(wait));
}

void ServerMetrics::ObserveUpdate(absl::Duration apply) {
  update_seconds_->Observe(absl::ToDoubleSeconds(apply));
}

void ServerMetrics::SetProgress(const Progress& p) {
  step_->Set(static_cast<double>(p.step));
  planned_steps_->Set(static_cast<double>(p.planned_steps));
  epoch_->Set(p.epoch);
  if (p.has_loss) loss_->Add({}).Set(p.loss);
  registered_workers_->Set(p.registered_workers);
  if (p.has_eval) {
    test_accuracy_->Add({}).Set(p.test_accuracy);
    test_loss_->Add({}).Set(p.test_loss);
  }
}

int ServerMetrics::ActiveWorkers() const {
  const int64_t since = UnixNanos(now_() - active_window_);
  int active = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (last_seen_[r].load(std::memory_order_relaxed) >= since) ++active;
  }
  return active;
}

void ServerMetrics::BeforeScrape() { active_workers_->Set(ActiveWorkers()); }

WorkerMetrics::WorkerMetrics(int rank) : Metrics("worker", rank) {
  Registry& reg = registry();
  const Labels& labels = constant_labels();
  calls_[static_cast<int>(Call::kPull)] = &AddSeconds(
      reg, labels, "dp_worker_pull_duration_seconds",
      "Pull calls (plain protocol and re-sync), as the worker saw them.");
  calls_[static_cast<int>(Call::kPush)] =
      &AddSeconds(reg, labels, "dp_worker_push_duration_seconds",
                  "Push calls of the plain protocol.");
  calls_[static_cast<int>(Call::kBarrier)] =
      &AddSeconds(reg, labels, "dp_worker_barrier_duration_seconds",
                  "Barrier calls of the plain protocol: waiting for the "
                  "other ranks and the update.");
  calls_[static_cast<int>(Call::kPushPull)] = &AddSeconds(
      reg, labels, "dp_worker_push_pull_duration_seconds",
      "Fused PushPull calls: push, barrier wait and the new weights.");
  compute_seconds_ = &AddSeconds(
      reg, labels, "dp_worker_compute_duration_seconds",
      "Forward and backward pass of the local batch (the straggler signal).");
  step_seconds_ =
      &AddSeconds(reg, labels, "dp_worker_step_duration_seconds",
                  "Wall time of a whole step: compute, exchange, new weights.");
  samples_ = &AddCounter(reg, labels, "dp_worker_samples_total",
                         "Training samples in the steps this worker finished.");
  resyncs_ = &AddCounter(reg, labels, "dp_worker_resyncs_total",
                         "Times dp-ps answered ABORTED (stale or future step) "
                         "and the worker re-joined.");
  loss_family_ = &LossFamily(reg, labels);
}

void WorkerMetrics::SetBackend(
    const std::map<std::string, std::string>& labels) {
  Labels all = constant_labels();
  all.insert(labels.begin(), labels.end());
  prometheus::BuildGauge()
      .Name("dp_worker_backend_info")
      .Help(
          "The compute backend of this worker, and its GPU for cuda; "
          "always 1.")
      .Register(registry())
      .Add(all)
      .Set(1);
}

void WorkerMetrics::ObserveCall(Call call, absl::Duration d) {
  calls_[static_cast<int>(call)]->Observe(absl::ToDoubleSeconds(d));
}

void WorkerMetrics::ObserveCompute(absl::Duration d, double loss) {
  compute_seconds_->Observe(absl::ToDoubleSeconds(d));
  if (loss_ == nullptr) loss_ = &loss_family_->Add({});
  loss_->Set(loss);
}

void WorkerMetrics::ObserveStep(absl::Duration d, int64_t samples) {
  step_seconds_->Observe(absl::ToDoubleSeconds(d));
  samples_->Increment(static_cast<double>(samples));
}

void WorkerMetrics::CountResync() { resyncs_->Increment(); }

}  // namespace dp
