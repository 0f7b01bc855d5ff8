// The worker's metrics over the shared registry (common/metrics.h).
#include "worker/worker_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace dp {

WorkerMetrics::WorkerMetrics(int rank) : Metrics("worker", rank) {
  calls_[static_cast<int>(Call::kPull)] = &NewSeconds(
      "dp_worker_pull_duration_seconds",
      "Pull calls (plain protocol and re-sync), as the worker saw them.");
  calls_[static_cast<int>(Call::kPush)] = &NewSeconds(
      "dp_worker_push_duration_seconds", "Push calls of the plain protocol.");
  calls_[static_cast<int>(Call::kBarrier)] =
      &NewSeconds("dp_worker_barrier_duration_seconds",
                  "Barrier calls of the plain protocol: waiting for the "
                  "other ranks and the update.");
  calls_[static_cast<int>(Call::kPushPull)] = &NewSeconds(
      "dp_worker_push_pull_duration_seconds",
      "Fused PushPull calls: push, barrier wait and the new weights.");
  compute_seconds_ = &NewSeconds(
      "dp_worker_compute_duration_seconds",
      "Forward and backward pass of the local batch (the straggler signal).");
  step_seconds_ =
      &NewSeconds("dp_worker_step_duration_seconds",
                  "Wall time of a whole step: compute, exchange, new weights.");
  samples_ = &NewCounter("dp_worker_samples_total",
                         "Training samples in the steps this worker finished.");
  resyncs_ = &NewCounter("dp_worker_resyncs_total",
                         "Times the worker registered again (dp-ps no longer "
                         "knew it, or a move to the newest version failed).");
  catch_ups_ = &NewCounter(
      "dp_worker_catch_ups_total",
      "Times dp-ps answered ABORTED (the job moved past this worker's step, "
      "e.g. a backup computed its block, or rolled back) and the worker "
      "moved to the newest version without registering again.");
  wait_timeouts_ = &NewCounter(
      "dp_worker_wait_timeouts_total",
      "Barrier waits that outlasted --wait_timeout_s; the worker logged "
      "whom it waited for and waited again.");
  // No series before the worker has joined: a 0 would read as "gRPC".
  shared_memory_family_ = &NewGaugeFamily(
      "dp_worker_shared_memory",
      "1 while the step's tensors go through shared memory with dp-ps, 0 "
      "through gRPC.");
  loss_family_ = &NewLossFamily();
}

void WorkerMetrics::SetSharedMemory(bool on) {
  if (shared_memory_ == nullptr)
    shared_memory_ = &shared_memory_family_->Add({});
  shared_memory_->Set(on);
}

void WorkerMetrics::SetBackend(
    const std::map<std::string, std::string>& labels) {
  prometheus::Labels all = constant_labels();
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
void WorkerMetrics::CountCatchUp() { catch_ups_->Increment(); }

void WorkerMetrics::CountWaitTimeout() { wait_timeouts_->Increment(); }

}  // namespace dp
