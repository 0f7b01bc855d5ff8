"""dp_ps.train: the whole worker loop for a torch.nn.Module, as dp-worker's
(worker/trainer.cc): compute the block dp-ps hands out, push, take the new
weights; rank 0 evaluates the test set at every epoch's end."""

import os
import signal
import threading
import time

import torch
import torch.nn.functional as F

from . import errors
from .metrics import WorkerMetrics
from .micro_batch_tree import sum_in_tree_order
from .step_channel import SPIN_US
from .worker import Worker

# Test samples per forward pass of the evaluation.
EVAL_CHUNK = 1000


def _batch(dataset, indices, device):
    xs, ys = zip(*(dataset[i] for i in indices))
    return (torch.stack([torch.as_tensor(x) for x in xs]).to(device),
            torch.as_tensor([int(y) for y in ys]).to(device))


def block_gradient(worker, model, loss_fn, dataset, device):
    """(flat gradient, mean loss) of worker.block: each micro-batch's
    mean-loss gradient computed alone (its own forward and backward, so that
    it never depends on what else this worker computes), summed in the
    micro-batch tree's order."""
    first, count = worker.block
    leaves, loss_sum = [], 0.0
    for j in range(first, first + count):
        x, y = _batch(dataset, worker.indices(j), device)
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p))
                 for name, p in model.named_parameters()}
        leaves.append(worker.gradient_of(grads).detach().to("cpu", torch.float32))
        # float32, summed as the C++ worker does (loss_sum += loss).
        loss_sum = float(torch.tensor(loss_sum, dtype=torch.float32) + loss.detach().float().cpu())
    mean = float(torch.tensor(loss_sum, dtype=torch.float32) / count)
    return sum_in_tree_order(leaves), mean


def evaluate(model, loss_fn, test_set, device):
    """(accuracy, mean loss, samples) of the model on test_set."""
    correct, loss_sum, n = 0, 0.0, len(test_set)
    model.eval()
    with torch.no_grad():
        for start in range(0, n, EVAL_CHUNK):
            x, y = _batch(test_set, range(start, min(start + EVAL_CHUNK, n)), device)
            out = model(x)
            loss_sum += float(loss_fn(out, y)) * len(y)
            correct += int((out.argmax(dim=1) == y).sum())
    model.train()
    return correct / n, loss_sum / n, n


class _StopSignals:
    """SIGTERM and SIGINT as dp-worker takes them (worker/worker_main.cc):
    the step in progress ends, then train raises Stopped (exit 3); a step
    that does not end within stop_timeout_s exits the process with 3. Only
    where signals can be handled (the main thread); elsewhere the caller's
    handlers stand."""

    def __init__(self, stop_timeout_s):
        self.signal = None
        self._timeout = stop_timeout_s
        self._old = {}
        self._timer = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc):
        if self._timer is not None:  # the step ended: train() returns or raises
            self._timer.cancel()
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _on_signal(self, number, _frame):
        if self.signal is not None:
            return
        self.signal = signal.Signals(number).name
        print(f"{self.signal}: stopping after the current step", flush=True)
        self._timer = threading.Timer(self._timeout, self._give_up)
        self._timer.daemon = True
        self._timer.start()

    def _give_up(self):
        print(f"the current step did not end within {self._timeout} s; exiting", flush=True)
        os._exit(errors.Stopped.exit_code)


def train(model, train_set, ps, loss_fn=F.cross_entropy, test_set=None, device="cpu", rank=-1,
          tls=None, token=None, data_id=None, metrics_port=0, retry_for_s=120.0,
          wait_timeout_s=30.0, data_plane="auto", stop_timeout_s=20.0, step_channel=True,
          spin_us=SPIN_US):
    """Trains `model` in the dp-ps job at `ps` until the job ends; see
    docs/python.md. Returns {"rank", "steps", "gradients", "last_loss",
    "step", "channel_exchanges", "step_calls", "test_accuracy" (rank 0, when it
    evaluated)}."""
    model.to(device)
    metrics = WorkerMetrics(metrics_port) if metrics_port else None
    try:
        with _StopSignals(stop_timeout_s) as stop:
            return _train(model, train_set, ps, loss_fn, test_set, device, metrics, stop,
                          dict(rank=rank, tls=tls, token=token, data_id=data_id, retry_for_s=retry_for_s,
                               wait_timeout_s=wait_timeout_s, metrics=metrics, data_plane=data_plane,
                               step_channel=step_channel, spin_us=spin_us))
    finally:
        if metrics:
            metrics.close()


def _train(model, train_set, ps, loss_fn, test_set, device, metrics, stop, worker_options):
    summary = {"steps": 0, "gradients": 0, "last_loss": None}
    with Worker(ps, model, train_set, **worker_options) as w:
        w.join()
        if metrics:
            metrics.set_rank(w.rank)
        print(f"rank {w.rank}: joined at step {w.step} of {w.total_steps} "
              f"({w.schedule.steps_per_epoch()} per epoch), tensors over {w.data_plane()}", flush=True)
        evaluated_final = False
        while not w.done:
            if stop.signal is not None:
                raise errors.Stopped(f"rank {w.rank}: stopped by {stop.signal} at step {w.step} "
                                     f"of {w.total_steps}")
            start, step = time.monotonic(), w.step
            if w.block is None:
                applied = w.wait()
            else:
                began = time.monotonic()
                gradient, loss = block_gradient(w, model, loss_fn, train_set, device)
                summary["gradients"] += w.block[1]
                summary["last_loss"] = loss
                if metrics:
                    metrics.observe_compute(time.monotonic() - began, loss)
                applied = w.push(gradient, loss)
            if not applied:
                continue
            summary["steps"] += 1
            if metrics:
                metrics.observe_step(time.monotonic() - start, w.schedule.batch_size)
            if w.rank == 0 and test_set is not None and w.schedule.ends_epoch(step):
                summary["test_accuracy"] = _report(w, model, loss_fn, test_set, device, step)
                evaluated_final = evaluated_final or w.step == w.total_steps
        # The others may have finished while rank 0 was away: it evaluates
        # the final weights all the same.
        if w.rank == 0 and test_set is not None and not evaluated_final and w.step == w.total_steps > 0:
            summary["test_accuracy"] = _report(w, model, loss_fn, test_set, device, w.total_steps - 1)
        # Without a test set the end alone is reported (no samples), so that
        # dp-ps does not wait for an evaluation that cannot come.
        if w.rank == 0 and test_set is None and w.step == w.total_steps > 0:
            _send_report(w, w.schedule.epoch_of(w.total_steps - 1) + 1, 0.0, 0.0, 0)
        summary.update(rank=w.rank, step=w.step, channel_exchanges=w.channel_exchanges,
                       step_calls=w.step_calls)
    return summary


def _report(w, model, loss_fn, test_set, device, finished):
    accuracy, loss, n = evaluate(model, loss_fn, test_set, device)
    epoch = w.schedule.epoch_of(finished) + 1
    print(f"rank 0: test accuracy {accuracy:.4f} after epoch {epoch}", flush=True)
    _send_report(w, epoch, accuracy, loss, n)
    return accuracy


def _send_report(w, epoch, accuracy, loss, n):
    try:
        w.report_eval(epoch, accuracy, loss, n, w.step == w.total_steps)
    except Exception as e:  # informative only: a refused report must not stop training
        print(f"rank 0: evaluation report not accepted: {e}", flush=True)
