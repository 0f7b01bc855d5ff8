// A dp-worker's parts, in order (see worker.h).
#include "worker/worker.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace dp {
namespace {

// The labels of dp_worker_backend_info.
std::map<std::string, std::string> BackendLabels(const BackendChoice& choice) {
  if (choice.null()) return {{"backend", "null"}};
  if (!choice.cuda()) return {{"backend", "cpu"}};
  const GpuInfo& gpu = choice.gpu();
  return {
      {"backend", "cuda"},
      {"device", absl::StrCat(gpu.device)},
      {"gpu", gpu.name},
      {"compute_capability", absl::StrCat(gpu.cc_major, ".", gpu.cc_minor)}};
}

}  // namespace

Worker::Worker(WorkerOptions options)
    : options_(std::move(options)), metrics_(options_.rank) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(WorkerOptions options) {
  std::unique_ptr<Worker> w(new Worker(std::move(options)));
  const WorkerOptions& o = w->options_;
  BackendRequest request = o.backend;
  request.rank = o.rank;
  ASSIGN_OR_RETURN(w->backend_, BackendChoice::Resolve(request));
  Log("backend: %s", w->backend_.Describe());
  if (o.health_port >= 0) {
    // NOT_SERVING until the worker has joined the job.
    ASSIGN_OR_RETURN(w->health_, HealthServer::Start("0.0.0.0", o.health_port));
    Log("health service on port %d", w->health_->port());
  }
  w->metrics_.SetBackend(BackendLabels(w->backend_));
  if (o.metrics_port != kMetricsOff) {
    ASSIGN_OR_RETURN(w->metrics_endpoint_,
                     w->metrics_.Serve(o.metrics_host, o.metrics_port));
    Log("metrics on %s:%d", o.metrics_host, w->metrics_endpoint_->port());
  }
  w->client_ = std::make_unique<PsGroup>(
      o.ps_addresses.empty() ? std::vector<std::string>{o.client.address}
                             : o.ps_addresses,
      o.client);
  if (w->client_->shards() > 1) {
    Log("dp-ps shards: %s", w->client_->address());
  }
  TrainerOptions t;
  t.rank = o.rank;
  t.data_dir = o.data_dir;
  t.backend = w->backend_;
  t.cpu_threads = o.cpu_threads;
  t.tf32 = o.tf32;
  t.fused = o.fused;
  t.stop = &w->stop_;
  t.on_joined = [h = w->health_.get()] {
    if (h != nullptr) h->SetReady(true);
  };
  t.metrics = &w->metrics_;
  w->trainer_ = std::make_unique<Trainer>(w->client_.get(), std::move(t));
  return w;
}

absl::Status Worker::Run() {
  absl::Status s = trainer_->Run();
  if (health_ != nullptr) health_->SetReady(false);
  return s;
}

}  // namespace dp
