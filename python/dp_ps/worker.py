"""dp_ps.Worker: one worker of a dp-ps job for a torch.nn.Module whose
weights dp-ps holds. It joins (Register with the model's and the data's
fingerprints, Attend), tells the step and the block of micro-batches to
compute, pushes their summed gradient and copies the new weights into the
module's parameters in place. Re-syncs as dp-worker does: ABORTED (the job
moved past this step) moves to the newest version; FAILED_PRECONDITION
(dp-ps restarted and no longer knows this rank) registers again."""

import os
import socket
import time

import grpc
import numpy as np
import torch

from . import errors
from ._proto import dp_pb2
from .data_order import BatchSampler, Schedule
from .fingerprint import data_fingerprint, model_fingerprint
from .micro_batch_tree import Block
from .safetensors import trained_tensors
from .shards import ShardGroup
from .step_channel import SPIN_US

# Re-syncs in a row without a finished step: something other than a
# restart is wrong.
MAX_RESYNCS_IN_A_ROW = 20

# SimpleNet's widths: the layers of a job that names none.
SIMPLENET = [784, 256, 128, 10]


def job_tensors(config):
    """[(name, shape)] of the job's model in flat-vector order: the
    config's tensors, or (a dp-ps that sends none) its MLP's."""
    if len(config.tensors) > 0:
        return [(t.name, tuple(t.shape)) for t in config.tensors]
    widths = list(config.layers) or SIMPLENET
    specs = []
    for layer in range(len(widths) - 1):
        specs.append((f"fc{layer + 1}.weight", (widths[layer + 1], widths[layer])))
        specs.append((f"fc{layer + 1}.bias", (widths[layer + 1],)))
    return specs


class Worker:
    """See docs/python.md. `data` is the training set (a map-style Dataset,
    fingerprinted with data_id) or its (num_samples, hash) fingerprint."""

    def __init__(self, ps, model, data, rank=-1, tls=None, token=None, data_id=None,
                 retry_for_s=120.0, wait_timeout_s=30.0, metrics=None, data_plane="auto",
                 step_channel=True, spin_us=SPIN_US):
        addresses = [a.strip() for a in ps.split(",") if a.strip()]
        if not addresses:
            raise errors.ConfigError(f"ps: no dp-ps address in {ps!r} (host:port, comma-separated)")
        self.model = model
        self._tensors = trained_tensors(model)
        self.fingerprint = data if isinstance(data, tuple) else data_fingerprint(data, data_id)
        self.retry_for_s = retry_for_s
        self.metrics = metrics
        self._group = ShardGroup(addresses, tls=tls, token=token, retry_for_s=retry_for_s,
                                 wait_timeout_s=wait_timeout_s, data_plane=data_plane,
                                 step_channel=step_channel, spin_us=spin_us)
        self._request = dp_pb2.RegisterRequest(
            rank=max(rank, 0), any_rank=rank < 0, worker_id=f"{socket.gethostname()}/{os.getpid()}",
            data=dp_pb2.DataFingerprint(num_samples=self.fingerprint[0], hash=self.fingerprint[1]))
        self.rank = rank
        self.step = 0
        self.block = None  # what to compute for `step`; None: nothing yet
        self.done = False
        self._offsets = []
        self._flat = None
        self._sampler = None

    def data_plane(self):
        """How tensors travel since the last join: "shared memory", or
        "gRPC" with the reason where shared memory was asked for."""
        clients = self._group.clients
        if all(c.plane is not None for c in clients):
            return "shared memory"
        why = next((c.why_not_shm for c in clients if c.why_not_shm), None)
        return f"gRPC ({why})" if why else "gRPC"

    @property
    def channel_exchanges(self):
        """Steps exchanged through shard 0's step channel (no call) so far."""
        return self._group.channel_exchanges

    @property
    def step_calls(self):
        """gRPC calls (Push, Pull, PushPull) the steps' exchanges made so far,
        to any shard: none over shared memory with step channels."""
        return self._group.step_calls

    def close(self):
        """Ends the attendance: dp-ps counts this worker gone at once."""
        self._group.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- joining ---------------------------------------------------------

    def join(self):
        """Registers with every shard and takes the job's newest weights.
        The shards can part between the two: one that restarted behind a
        push another took after it lacks the version shard 0 is at
        (ABORTED). The next registration finds them apart and rolls them
        back to one step."""
        for _ in range(MAX_RESYNCS_IN_A_ROW):
            self._register()
            try:
                self._adopt(self._pull_newest())
                return
            except errors.DpError as e:
                if getattr(e, "code", None) != grpc.StatusCode.ABORTED:
                    raise
                print(f"rank {self.rank}: the job moved between its registration and its pull ({e}): "
                      "registering again", flush=True)
        raise errors.WorkerFailure(f"rank {self.rank}: {MAX_RESYNCS_IN_A_ROW} joins in a row met "
                                   "shards at other versions")

    def _register(self):
        status = self._group.get_status()
        self._request.model_fingerprint = self._check_model(status.config)
        joined, self.step = self._group.register(self._request, self.retry_for_s)
        self._check_encodings(joined.config)
        self.config = joined.config
        self.rank = joined.rank
        self._request.rank = joined.rank  # asked for again at the next join
        self.schedule = Schedule.of_job(joined.config, self.fingerprint[0])
        self.total_steps = joined.total_steps
        if self._sampler is None or self._sampler._s != self.schedule:
            self._sampler = BatchSampler(self.schedule)
        self._flat = np.zeros(joined.num_params, dtype=np.float32)

    def _check_model(self, config):
        """The model fingerprint of the job's tensors, once the module's
        state_dict is seen to hold them: the same names and shapes, matched
        by name (the job's order is the flat vector's, whatever the
        module's)."""
        specs = job_tensors(config)
        mine = {name: tuple(t.shape) for name, t in self._tensors.items()}
        if mine != dict(specs) or len(specs) != len(mine):
            show = lambda s: ", ".join(f"{n} {list(shape)}" for n, shape in s)
            raise errors.ModelMismatch(
                f"the module's tensors ({show(mine.items())}) are not the job's ({show(specs)}): "
                "start dp-ps with --init_model from dp_ps.save_init(model, path)")
        self._offsets = []
        offset = 0
        for name, shape in specs:
            size = int(np.prod(shape, dtype=np.int64))
            self._offsets.append((name, self._tensors[name], offset, size))
            offset += size
        return model_fingerprint(specs)

    @staticmethod
    def _check_encodings(config):
        if config.grad_encoding != dp_pb2.ENCODING_F32 or config.weight_encoding != dp_pb2.ENCODING_F32:
            raise errors.ConfigError("the Python worker sends and receives float32 only; the job has "
                                     "--grad_encoding or --weight_encoding bf16")

    # -- the step ---------------------------------------------------------

    def indices(self, micro_batch):
        """The sample indices of micro-batch `micro_batch` of this step."""
        return self._sampler.indices(self.step, micro_batch)

    def push(self, gradient, loss):
        """Pushes the block's gradient (a flat float32 tensor: the tree sum of
        its micro-batches' mean gradients, in the job's tensor order) and its
        mean loss. Returns True when the step was applied and its weights
        are in the module; False when there is more work (self.block) or
        the worker re-synced to another step."""
        g = gradient.detach().to("cpu", torch.float32).contiguous().numpy()
        request = dp_pb2.PushRequest(rank=self.rank, step=self.step, loss=float(loss),
                                     num_samples=self.schedule.batch_size * self.block[1],
                                     block=dp_pb2.Block(first=self.block[0], count=self.block[1]))
        return self._exchange(request, g.astype("<f4", copy=False))

    def wait(self):
        """Nothing to compute (self.block is None): waits for the step, or
        for work. Returns as push does."""
        return self._exchange(dp_pb2.PushRequest(rank=self.rank, step=self.step, idle=True), None)

    def _exchange(self, request, gradient):
        began = time.monotonic()
        try:
            answer = self._group.push_pull(request, gradient, self._flat)
            if self.metrics:
                self.metrics.observe("push_pull", time.monotonic() - began)
                self.metrics.count("sent_bytes", self._group.wire_bytes[0])
                self.metrics.count("received_bytes", self._group.wire_bytes[1])
        except errors.DpError as e:
            if getattr(e, "code", None) not in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION) \
                    or isinstance(e, (errors.JobFailed, errors.ModelMismatch, errors.DataMismatch)):
                raise
            self._resync(e)
            return False
        if answer.work_only and answer.step == self.step:
            self.block = _block(answer.block)
            return False
        if answer.work_only or answer.step != self.step + 1:
            self._resync(None)
            return False
        self._resyncs = 0
        self._adopt(answer)
        return True

    def _resync(self, why):
        self._resyncs = getattr(self, "_resyncs", 0) + 1
        if self._resyncs > MAX_RESYNCS_IN_A_ROW:
            raise errors.WorkerFailure(f"rank {self.rank}: {MAX_RESYNCS_IN_A_ROW} re-syncs in a row "
                                       f"without progress; last: {why}")
        if self.metrics:
            self.metrics.count("resyncs" if why is not None and why.code ==
                               grpc.StatusCode.FAILED_PRECONDITION else "catch_ups")
        if why is None or why.code != grpc.StatusCode.FAILED_PRECONDITION:
            print(f"rank {self.rank}: moving on from step {self.step}: {why or 'another version came'}",
                  flush=True)
            try:
                self._adopt(self._pull_newest())
                return
            except errors.DpError as e:
                if getattr(e, "code", None) not in (grpc.StatusCode.ABORTED,
                                                    grpc.StatusCode.FAILED_PRECONDITION):
                    raise
                why = e
        print(f"rank {self.rank}: re-joining at step {self.step}: {why}", flush=True)
        self.join()

    def _pull_newest(self):
        """The newest weights, pulled again while the job moves on between
        the shards' answers (the shards then are not apart) or under a read
        from shared memory (the version asked for was rewritten)."""
        for _ in range(MAX_RESYNCS_IN_A_ROW):
            try:
                return self._group.pull(self.rank, self._flat)
            except errors.DpError as e:
                if not getattr(e, "moved_on", False):
                    raise
                last = e
        raise last

    def _adopt(self, answer):
        self.step = answer.step
        self.block = _block(answer.block)
        self.done = answer.done or self.step >= self.total_steps
        flat = torch.from_numpy(self._flat)
        with torch.no_grad():
            for _, t, offset, size in self._offsets:
                t.copy_(flat[offset:offset + size].view(t.shape))

    def gradient_of(self, grads):
        """The flat float32 vector, in the job's order, of {name: tensor}."""
        return torch.cat([grads[name].reshape(-1) for name, _, _, _ in self._offsets])

    def report_eval(self, epoch, accuracy, loss, num_samples, final):
        """Rank 0: the test-set result of the current weights, for dp-ps's log."""
        self._group.report_eval(dp_pb2.ReportEvalRequest(
            rank=self.rank, step=self.step, epoch=epoch, accuracy=accuracy, loss=loss,
            num_samples=num_samples, final=final))


def _block(b):
    return Block(b.first, b.count) if b.count > 0 else None
