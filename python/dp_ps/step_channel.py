"""The worker's end of dp-ps's step channel (common/step_channel.h), as
dp-worker's ChannelClient speaks it: a step's push-and-wait is written into
the registration's page of shared memory and published by bumping the
request's sequence word; dp-ps's answer comes back under the answer's
word. No gRPC call per step.

Python has no memory fence to call. The page's words are read and written
as aligned 4- and 8-byte values, whose loads x86-64 keeps in order, as it
keeps stores in order (a body written before its word is seen before it).
The two places that need a store ordered before a later load are left to
the kernel: a posted request always wakes dp-ps (instead of waking it only
when its parked flag says so), and a park hands the futex the answer word
it last saw, which the kernel reads again after a full barrier."""

import ctypes
import mmap
import os
import struct
import threading
import time

import grpc
import numpy as np

from . import errors

PAGE_BYTES = 4096  # kStepChannelBytes
MAX_MESSAGE_BYTES = 1024  # ChannelResponse::kMaxMessageBytes
# Byte offsets in the page: common/step_channel.cc's RequestHalf (the
# worker's) and ResponseHalf (dp-ps's), which it asserts.
REQUEST_SEQ, SERVER_PARKED, STEP, BLOCK_FIRST, BLOCK_COUNT, LOSS_BITS, NUM_SAMPLES, ENCODING, IDLE, KIND = (
    0, 4, 8, 16, 20, 24, 28, 32, 36, 40)
# ChannelKind: the call a request stands for. PUSH_PULL: shard 0's push and
# wait for the step; PUSH: another shard's push, answered once read; PULL:
# version `step`'s weights in shared memory.
PUSH_PULL, PUSH, PULL = 0, 1, 2
ANSWER_SEQ, CLIENT_PARKED, CODE, ANSWER_STEP, ANSWER_BLOCK_FIRST, ANSWER_BLOCK_COUNT, FLAGS = (
    64, 68, 72, 80, 88, 92, 96)
MESSAGE_BYTES, MESSAGE, CLOSED, CLOSED_CODE, CLOSED_MESSAGE = 100, 104, 1128, 1132, 1136
DONE, WORK_ONLY = 1, 2
# dp-worker's --spin_us, its default and bound: how long an answer is looked
# for, yielding the core at each look, before the wait parks.
SPIN_US, MAX_SPIN_US = 300, 10000
SPIN_S = SPIN_US * 1e-6

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared, not FUTEX_PRIVATE_FLAG
_INT_MAX = 2**31 - 1
_libc = ctypes.CDLL(None, use_errno=True)  # releases the GIL in the call
_CODES = {c.value[0]: c for c in grpc.StatusCode}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex(address, op, value, timeout_s=None):
    ts = None
    if timeout_s is not None:
        timeout_s = max(timeout_s, 0.0)
        ts = ctypes.byref(_Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9)))
    _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(op),
                  ctypes.c_uint(value), ts, None, ctypes.c_int(0))


class Answer:
    """ChannelResponse: version `step`'s weights are in shared memory with
    `block` to compute, or (work_only) more work at `step`."""

    def __init__(self, step, block, done, work_only):
        self.step, self.block, self.done, self.work_only = step, block, done, work_only


class StepChannel:
    """One registration's page (descriptor `fd`, which it takes). call()
    from one thread; close() from any."""

    def __init__(self, fd, address, spin_s=SPIN_S):
        try:
            have = os.fstat(fd).st_size
            if have < PAGE_BYTES:
                raise errors.WorkerFailure(f"dp-ps's step channel holds {have} bytes, expected {PAGE_BYTES}")
            self._page = mmap.mmap(fd, PAGE_BYTES, flags=mmap.MAP_SHARED,
                                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._address = address  # for errors, as gRPC's name dp-ps
        self._spin_s = spin_s
        self._u32 = np.frombuffer(self._page, dtype="<u4")
        self._i32 = np.frombuffer(self._page, dtype="<i4")
        self._i64 = np.frombuffer(self._page, dtype="<i8")
        self._base = self._u32.ctypes.data
        self._lock = threading.Lock()  # close() against unmapping
        self._closed = False
        self._posted = int(self._u32[REQUEST_SEQ // 4])  # a fresh page: 0
        self._pending = None
        self._answered = True

    def unmap(self):
        with self._lock:
            self._closed = True
            self._u32 = self._i32 = self._i64 = None
            self._page.close()

    def close(self):
        """dp-ps is gone (the attendance ended): every wait, the current
        one included, fails with UNAVAILABLE from now on."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _futex(self._base + ANSWER_SEQ, _FUTEX_WAKE, _INT_MAX)

    def call(self, step, block, loss, num_samples, idle, timeout_s, kind=PUSH_PULL):
        """Posts a request of `kind` - by default a push-and-wait (block:
        (first, count) of the gradient in the slot); PULL asks for version
        `step` - and waits up to timeout_s for its Answer; errors as
        dp_ps.errors with dp-ps's gRPC code. The same request again while
        the last is unanswered (after DEADLINE_EXCEEDED) waits for that one."""
        loss_bits = struct.unpack("<I", struct.pack("<f", loss))[0]
        # The encoding word: the job's grad_encoding, float32 (ENCODING_F32).
        request = (step, block[0], block[1], loss_bits, num_samples, 0, 1 if idle else 0, kind)
        deadline = time.monotonic() + timeout_s
        if not self._answered:
            last = self._await(self._posted, deadline)
            if request == self._pending:
                return last
        if self._closed:
            raise self._unavailable()
        self._i64[STEP // 8] = step
        for offset, value in zip((BLOCK_FIRST, BLOCK_COUNT, LOSS_BITS, NUM_SAMPLES, ENCODING, IDLE, KIND),
                                 request[1:]):
            self._u32[offset // 4] = value & 0xFFFFFFFF
        self._posted = (self._posted + 1) & 0xFFFFFFFF
        self._u32[REQUEST_SEQ // 4] = self._posted
        self._pending, self._answered = request, False
        _futex(self._base + REQUEST_SEQ, _FUTEX_WAKE, _INT_MAX)
        return self._await(self._posted, deadline)

    def _unavailable(self):
        return errors.coded(f"dp-ps at {self._address}: UNAVAILABLE: dp-ps ended this worker's "
                            "attendance (it is gone or shutting down)", grpc.StatusCode.UNAVAILABLE)

    def _await(self, seq, deadline):
        # No view of the page in a local: a frame that raised, kept by its
        # exception's traceback, would keep the page from being unmapped.
        word = ANSWER_SEQ // 4
        while True:
            answered = int(self._u32[word]) == seq
            if not answered and self._spin_s > 0:
                until = time.monotonic() + self._spin_s
                while not answered and time.monotonic() < until:
                    os.sched_yield()
                    answered = int(self._u32[word]) == seq
            if answered:
                break
            if self._closed:
                raise self._unavailable()
            if self._u32[CLOSED // 4] != 0:
                code = _CODES.get(int(self._i32[CLOSED_CODE // 4]), grpc.StatusCode.UNKNOWN)
                if code == grpc.StatusCode.OK:
                    code = grpc.StatusCode.UNAVAILABLE
                raise errors.for_status(code, self._text(CLOSED_MESSAGE, MAX_MESSAGE_BYTES, nul=True),
                                        self._address)
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.coded(f"dp-ps at {self._address}: no answer through shared memory "
                                   "before the wait's deadline", grpc.StatusCode.DEADLINE_EXCEEDED)
            self._u32[CLIENT_PARKED // 4] = 1
            now = int(self._u32[word])
            if now != seq and not self._closed and self._u32[CLOSED // 4] == 0:
                _futex(self._base + ANSWER_SEQ, _FUTEX_WAIT, now, left)
            self._u32[CLIENT_PARKED // 4] = 0
        code = _CODES.get(int(self._i32[CODE // 4]), grpc.StatusCode.UNKNOWN)
        flags = int(self._u32[FLAGS // 4])
        answer = Answer(int(self._i64[ANSWER_STEP // 8]),
                        (int(self._i32[ANSWER_BLOCK_FIRST // 4]), int(self._i32[ANSWER_BLOCK_COUNT // 4])),
                        bool(flags & DONE), bool(flags & WORK_ONLY))
        message = self._text(MESSAGE, min(int(self._u32[MESSAGE_BYTES // 4]), MAX_MESSAGE_BYTES))
        self._answered = True
        if code != grpc.StatusCode.OK:
            raise errors.for_status(code, message, self._address)
        return answer

    def _text(self, offset, size, nul=False):
        raw = bytes(self._page[offset:offset + size])
        if nul:
            raw = raw.split(b"\0", 1)[0]
        return raw.decode("utf-8", "replace")
