"""dp-ps's shared memory, taken as dp-worker takes it (common/shared_memory.h):
the descriptors handed over dp-ps's Unix socket for Register's one-time
ticket, the weights read from their double buffer under its sequence
counter, and the gradient written into this rank's slot, so that a step
moves no tensor through gRPC; with the step channel's page (step_channel.py)
a step makes no call either."""

import mmap
import os
import platform
import socket
import time

import grpc
import numpy as np

from . import errors
from .step_channel import SPIN_S, StepChannel

# A weights buffer's header: sequence counter (u64, odd while dp-ps
# writes), version (i64), number of values (i64), encoding (u32), padded
# to a cache line; the values follow.
HEADER_BYTES = 64
F32 = 0  # the header's encoding of float32 (common/tensor_codec.h)
DESCRIPTORS = 3  # weights, gradient slot, step-channel page
# A look that meets dp-ps's publish waits this long for it to end
# (worker/ps_client.cc's patience).
PATIENCE_S = 2.0


def why_unusable():
    """None where this process can read dp-ps's weights safely; else why
    not. The reads below are ordered only by x86-64's memory model (loads
    are not reordered with loads): Python has no fence to call."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the Python worker reads shared memory on x86-64 only (this is {platform.machine()})"
    return None


def weights_region_bytes(num_values):
    """common/shared_memory.cc's WeightsRegionBytes for float32."""
    values = (4 * num_values + HEADER_BYTES - 1) // HEADER_BYTES * HEADER_BYTES
    return 2 * (HEADER_BYTES + values)


def fetch(socket_name, ticket):
    """The descriptors dp-ps's socket hands out for `ticket`. The errors
    say what dp-worker's FetchSharedMemory says."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            s.connect("\0" + socket_name)
        except OSError as e:
            raise errors.WorkerFailure(f"dp-ps's shared memory is not reachable from here ({e.strerror}): "
                                       "another host or network namespace") from None
        s.settimeout(5.0)
        try:
            s.sendall(ticket)
        except OSError:
            pass  # dp-ps closes at once on a peer it refuses; the verdict says so
        try:
            verdict, fds, flags, _ = socket.recv_fds(s, 1, DESCRIPTORS + 1)
        except OSError:
            verdict, fds, flags = b"", [], 0
    finally:
        s.close()
    if verdict != b"\x01" or not fds:
        _close_all(fds)
        raise errors.WorkerFailure("dp-ps refused the shared-memory ticket (used already, withdrawn, "
                                   "or another user)")
    if flags & socket.MSG_CTRUNC or len(fds) != DESCRIPTORS:
        _close_all(fds)
        raise errors.WorkerFailure(f"dp-ps handed {len(fds)} shared-memory descriptors, "
                                   f"expected {DESCRIPTORS}")
    return fds


def _close_all(fds):
    for fd in fds:
        os.close(fd)


def _map(fd, size, writable):
    try:
        have = os.fstat(fd).st_size
        if have < size:
            raise errors.WorkerFailure(f"dp-ps's shared memory holds {have} bytes, expected {size}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=prot)
    finally:
        os.close(fd)


class SharedPlane:
    """One shard's weights and this rank's slot of its range (`length`
    float32 values), for registration `slot_id`; with `step_channel`, its
    page (self.channel, else None), whose errors name dp-ps at `address` and
    whose waits spin for `spin_s` before they park."""

    def __init__(self, socket_name, ticket, length, slot_id, address="", step_channel=False,
                 spin_s=SPIN_S):
        fds = fetch(socket_name, ticket)
        self.channel = None
        if not step_channel:
            os.close(fds[2])
        else:
            try:
                self.channel = StepChannel(fds[2], address, spin_s)  # takes fds[2]
            except BaseException:
                _close_all(fds[:2])
                raise
        try:
            weights = _map(fds[0], weights_region_bytes(length), writable=False)
        except BaseException:
            os.close(fds[1])
            self.drop_channel()
            raise
        self._weights = weights
        try:
            self._slot = _map(fds[1], 4 * length, writable=True)
        except BaseException:
            weights.close()
            self.drop_channel()
            raise
        self.length = length
        self.slot_id = slot_id
        self._half = len(weights) // 2
        self._u64 = np.frombuffer(weights, dtype="<u8")
        self._i64 = np.frombuffer(weights, dtype="<i8")
        self._u32 = np.frombuffer(weights, dtype="<u4")
        self._slot_values = np.frombuffer(self._slot, dtype="<f4")

    def close(self):
        # The views go first: an mmap with views on it cannot close.
        self._u64 = self._i64 = self._u32 = self._slot_values = None
        self._weights.close()
        self._slot.close()
        self.drop_channel()

    def drop_channel(self):
        if self.channel is not None:
            self.channel.unmap()
            self.channel = None

    def write_gradient(self, values):
        """This range's gradient (float32) into the slot; dp-ps reads it once
        the push that names the slot arrives, before it answers."""
        self._slot_values[:] = values

    def read_weights(self, step, out):
        """Version `step` into `out` (float32, `length` values). ABORTED
        (re-sync) when the buffer holds another version or dp-ps kept
        rewriting it, marked moved_on as dp-worker's "moved under the
        read": the job went on, and pulling again gets the newest; DATA_LOSS
        when it does not hold what it should."""
        base = (step & 1) * self._half
        word = base // 8
        give_up = time.monotonic() + PATIENCE_S
        attempt = 0
        while True:
            attempt += 1
            if attempt > 64:
                if time.monotonic() > give_up:
                    raise _moved(f"the shared weights kept changing while read for {PATIENCE_S} s")
                os.sched_yield()  # let a descheduled writer finish
            seq = int(self._u64[word])
            if seq % 2 == 1:
                continue
            found_step = int(self._i64[word + 1])
            num_values = int(self._i64[word + 2])
            encoding = int(self._u32[(base + 24) // 4])
            if int(self._u64[word]) != seq:
                continue
            if encoding != F32 or num_values != self.length:
                raise errors.coded(f"the shared weights' buffer {step & 1} holds {num_values} values "
                                   f"in encoding {encoding}; expected {self.length} float32",
                                   grpc.StatusCode.DATA_LOSS)
            if found_step != step:
                raise _moved(f"the shared weights' buffer of version {step} holds version "
                             f"{found_step}: re-sync")
            # A view of the mapping lives only for the copy: a frame that
            # raised (kept by its exception's traceback until a garbage
            # collection) must hold none, or the mapping cannot be closed.
            out[:] = np.frombuffer(self._weights, dtype="<f4", count=self.length, offset=base + HEADER_BYTES)
            if int(self._u64[word]) == seq:
                return


def _moved(message):
    e = errors.coded(message, grpc.StatusCode.ABORTED)
    e.moved_on = True
    return e
