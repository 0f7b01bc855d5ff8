"""The Python worker's metrics, under dp-worker's names where they apply
(worker/worker_metrics.cc, common/metrics.cc), served for Prometheus on
metrics_port (-1: any free port, logged)."""

import threading
from wsgiref.simple_server import make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

# dp-ps's and dp-worker's histogram buckets (SecondsBucketBoundaries).
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1, 2.5, 5, 10, 30, 60)

_SECONDS = {
    "pull": ("dp_worker_pull_duration_seconds", "Pull calls (joins and re-syncs), as the worker saw them."),
    "push_pull": ("dp_worker_push_pull_duration_seconds",
                  "Fused PushPull calls: push, barrier wait and the new weights."),
    "compute": ("dp_worker_compute_duration_seconds",
                "Forward and backward passes of the block (the straggler signal)."),
    "step": ("dp_worker_step_duration_seconds", "Wall time of a whole step: compute, exchange, new weights."),
}
_COUNTERS = {
    "samples": ("dp_worker_samples", "Training samples in the steps this worker finished."),
    "resyncs": ("dp_worker_resyncs", "Times the worker registered again (dp-ps no longer knew it)."),
    "catch_ups": ("dp_worker_catch_ups", "Times the worker moved to the newest version without registering again."),
    "wait_timeouts": ("dp_worker_wait_timeouts", "Step waits that outlasted wait_timeout_s."),
    "sent_bytes": ("dp_sent_bytes", "Serialized bytes of gradients sent."),
    "received_bytes": ("dp_received_bytes", "Serialized bytes of weights received."),
}


class WorkerMetrics:
    def __init__(self, port, host="0.0.0.0"):
        self.registry = CollectorRegistry()
        labels = ["role", "rank"]
        self._families = {k: Histogram(n, h, labels, registry=self.registry, buckets=BUCKETS)
                          for k, (n, h) in _SECONDS.items()}
        self._families.update({k: Counter(n, h, labels, registry=self.registry)
                               for k, (n, h) in _COUNTERS.items()})
        self._families["loss"] = Gauge("dp_training_loss", "Training loss of the last block computed.",
                                       labels, registry=self.registry)
        self._families["info"] = Gauge("dp_worker_backend_info", "The compute backend of this worker; "
                                       "always 1.", labels + ["backend"], registry=self.registry)
        self._series = {}
        self._server = make_server(host, max(port, 0), make_wsgi_app(self.registry), ThreadingWSGIServer,
                                   handler_class=_SilentHandler)
        self.port = self._server.server_port
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        print(f"metrics on port {self.port}", flush=True)

    def set_rank(self, rank, backend="torch"):
        """The series appear once the rank is known (dp-ps may pick it)."""
        self._series = {k: f.labels(role="worker", rank=str(rank)) for k, f in self._families.items()
                        if k != "info"}
        self._families["info"].labels(role="worker", rank=str(rank), backend=backend).set(1)

    def observe(self, what, seconds):
        if what in self._series:
            self._series[what].observe(seconds)

    def count(self, what, n=1):
        if what in self._series:
            self._series[what].inc(n)

    def observe_compute(self, seconds, loss):
        self.observe("compute", seconds)
        if "loss" in self._series:
            self._series["loss"].set(loss)

    def observe_step(self, seconds, samples):
        self.observe("step", seconds)
        self.count("samples", samples)

    def close(self):
        self._server.shutdown()
        self._server.server_close()
