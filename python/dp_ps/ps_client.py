"""One dp-ps over gRPC, as worker/ps_client.cc speaks to it: every call
with a deadline; UNAVAILABLE (dp-ps starting or restarting) and a call
cancelled by a draining dp-ps retried with exponential backoff and full
jitter for retry_for_s; the Attend call held open while registered, so
that dp-ps learns at once when this process goes; errors as dp_ps.errors."""

import random
import threading
import time
from dataclasses import dataclass

import grpc

from . import errors
from ._proto import dp_pb2, dp_pb2_grpc
from .shared_memory import SharedPlane, why_unusable
from .step_channel import MAX_SPIN_US, SPIN_US

DATA_PLANES = ("auto", "grpc", "shm")


@dataclass
class Tls:
    """dp-worker's --tls_ca, --tls_cert, --tls_key and --tls_server_name:
    PEM file paths; ca alone verifies dp-ps, cert and key are the client's
    certificate for mTLS."""
    ca: str = None
    cert: str = None
    key: str = None
    server_name: str = None

    @classmethod
    def of(cls, tls):
        """A Tls from None, a Tls, or a dict of its fields."""
        if tls is None or isinstance(tls, cls):
            return tls
        unknown = set(tls) - {"ca", "cert", "key", "server_name"}
        if unknown:
            raise errors.ConfigError(f"tls: unknown keys {sorted(unknown)} "
                                     "(ca, cert, key, server_name)")
        return cls(**tls)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _channel(address, tls, max_message_bytes):
    # dp-worker's channel arguments (proto/grpc_server.cc's
    # ClientChannelArguments): pings through a long silent wait, that dp-ps
    # accepts as often as they come; a reconnect backoff of at most 1 s, not
    # gRPC's default that grows to 120 s after a few failed connects (a
    # channel then sat unconnected for minutes while dp-ps served others);
    # a renamed dp-ps pod looked up again within a second.
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", max_message_bytes),
               ("grpc.http2.lookahead_bytes", max_message_bytes),
               ("grpc.keepalive_time_ms", 20000),
               ("grpc.keepalive_timeout_ms", 10000),
               ("grpc.keepalive_permit_without_calls", 1),
               ("grpc.http2.max_pings_without_data", 0),
               ("grpc.initial_reconnect_backoff_ms", 100),
               ("grpc.min_reconnect_backoff_ms", 100),
               ("grpc.max_reconnect_backoff_ms", 1000),
               ("grpc.dns_min_time_between_resolutions_ms", 1000)]
    if tls is None:
        return grpc.insecure_channel(address, options)
    if (tls.cert is None) != (tls.key is None):
        raise errors.ConfigError("tls: cert and key go together (the client's certificate)")
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca) if tls.ca else None,
        private_key=_read(tls.key) if tls.key else None,
        certificate_chain=_read(tls.cert) if tls.cert else None)
    return grpc.secure_channel(address, credentials, options)


def error_of(e, address):
    """The dp_ps.errors exception for a failed call (errors.for_status)."""
    return errors.for_status(e.code(), e.details() or "", address)


_READY = 2  # grpc_connectivity_state GRPC_CHANNEL_READY
_STATE_NAMES = {0: "idle", 1: "connecting", _READY: "ready", 3: "in transient failure",
                4: "shut down"}
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class PsClient:
    """data_plane as dp-worker's --data_plane: "auto" takes the shared
    memory dp-ps offers when it can reach it (its host), else gRPC; "shm"
    fails where it cannot; "grpc" never asks for it. step_channel as
    dp-worker's --step_channel: with shared memory, each step goes through
    the registration's step channel instead of a PushPull call; spin_us as
    dp-worker's --spin_us: how long its waits look for the answer, yielding
    the core at each look, before they park."""

    def __init__(self, address, tls=None, token=None, call_timeout_s=30.0,
                 wait_timeout_s=30.0, retry_for_s=120.0, max_message_bytes=4 << 20,
                 data_plane="auto", step_channel=True, spin_us=SPIN_US):
        if data_plane not in DATA_PLANES:
            raise errors.ConfigError(f"data_plane: {data_plane!r} is none of {', '.join(DATA_PLANES)}")
        if not 0 <= spin_us <= MAX_SPIN_US:
            raise errors.ConfigError(f"spin_us: {spin_us!r} is outside [0, {MAX_SPIN_US}] microseconds")
        self.spin_s = spin_us * 1e-6
        self.address = address
        self.data_plane = data_plane
        self.step_channel = step_channel
        self.plane = None  # SharedPlane since the last Register, or None
        self.why_not_shm = None
        self.call_timeout_s = call_timeout_s
        self.wait_timeout_s = wait_timeout_s
        self.retry_for_s = retry_for_s
        self._tls = Tls.of(tls)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._max_message_bytes = max_message_bytes
        self._channel = _channel(address, self._tls, max_message_bytes)
        self._stub = dp_pb2_grpc.ParameterServerStub(self._channel)
        self._attendance = None

    def close(self):
        self.end_attendance()
        self._drop_plane()
        self._channel.close()

    def _drop_plane(self):
        if self.plane is not None:
            self.plane.close()
            self.plane = None

    def fit_messages(self, num_params):
        """A channel with room for the model's tensors (gRPC's 4 MiB default
        holds only small ones)."""
        need = num_params * 4 + (1 << 20)
        if need > self._max_message_bytes:
            self._max_message_bytes = need
            self._reconnect()

    def _reconnect(self):
        """A new channel (and stub) in place of the current one."""
        self.end_attendance()
        self._channel.close()
        self._channel = _channel(self.address, self._tls, self._max_message_bytes)
        self._stub = dp_pb2_grpc.ParameterServerStub(self._channel)

    def call(self, method, request, timeout_s=None):
        """stub.method(request) with deadlines and retries (see module doc)."""
        timeout_s = timeout_s or self.call_timeout_s
        give_up = time.monotonic() + self.retry_for_s
        backoff, attempt, first = 0.05, 0, None
        while True:
            attempt += 1
            # A retry waits for the channel to connect instead of failing
            # fast on one that failed before (worker/ps_client.cc's reason).
            deadline = timeout_s if attempt == 1 else min(timeout_s, max(give_up - time.monotonic(), 0.01))
            try:
                return getattr(self._stub, method)(request, timeout=deadline, metadata=self._metadata,
                                                   wait_for_ready=attempt > 1)
            except grpc.RpcError as e:
                code = e.code()
                first = first or f"{code.name}: {e.details()}"
                state = self._channel_state()  # before any redial
                # A retry's deadline that passed while the channel never
                # connected waited for dp-ps, not for a step.
                waited_for_connection = (attempt > 1 and code == grpc.StatusCode.DEADLINE_EXCEEDED
                                         and state != _READY)
                if code not in _RETRYABLE and not waited_for_connection:
                    raise error_of(e, self.address) from None
                if waited_for_connection:
                    # A channel that did not connect for a whole deadline
                    # while dp-ps served others (seen with four workers
                    # starting at once): the next attempt dials afresh.
                    self._reconnect()
                if time.monotonic() + backoff > give_up:
                    raise errors.PsUnreachable(
                        f"dp-ps at {self.address} is unavailable for {method} after {attempt} "
                        f"attempts over {self.retry_for_s:.0f} s: {e.details()} (the first: "
                        f"{first}; the channel {_STATE_NAMES.get(state, 'in an unknown state')}; "
                        "when dp-ps is up, this is also how a TLS mismatch shows)") from None
                time.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 2.0)

    def _channel_state(self):
        """The channel's connectivity state, None if it cannot be asked:
        grpc's Python API tells it only to subscribers, so the channel's
        core object is asked directly."""
        try:
            return self._channel._channel.check_connectivity_state(False)
        except AttributeError:
            return None

    def register(self, request):
        """Register, then attend with the registration's session."""
        if self.data_plane != "grpc":
            request.shared_memory = True
        response = self.call("Register", request)
        self.end_attendance()
        self.fit_messages(response.num_params)
        if response.session != 0:
            self._attendance = _Attendance(self._stub, self._metadata, response.rank,
                                           response.session)
        self._take_plane(response)
        return response

    def _take_plane(self, response):
        # dp-ps gave this registration a new slot and reads the old one no more.
        self._drop_plane()
        self.why_not_shm = None
        if self.data_plane == "grpc":
            return
        why = why_unusable()
        if why is None and not response.shm_socket:
            why = "dp-ps offers no shared memory (--shared_memory=false, or it could not make any)"
        if why is None:
            try:
                self.plane = SharedPlane(response.shm_socket, response.shm_ticket, response.shard.length,
                                         response.shm_slot, self.address, self.step_channel,
                                         self.spin_s)
            except errors.DpError as e:
                why = str(e)
        if self.plane is not None and self.plane.channel is not None and self._attendance is not None:
            # The attendance's end is dp-ps gone: the channel's wait ends
            # with it, and the step goes over gRPC, which tells whether the
            # dp-ps that answers knows this registration.
            self._attendance.when_ended(self.plane.channel.close)
        if why is not None and self.data_plane == "shm":
            self.end_attendance()
            raise errors.ConfigError(f"data_plane='shm': {why}")
        self.why_not_shm = why

    def end_attendance(self):
        """dp-ps counts this registration gone, its rank free."""
        if self._attendance is not None:
            self._attendance.end()
            self._attendance = None


class _Attendance:
    """The Attend call, read to its end on a thread of its own: dp-ps
    ending it (shutdown, another registration of the rank) is no error."""

    def __init__(self, stub, metadata, rank, session):
        self._call = stub.Attend(dp_pb2.AttendRequest(rank=rank, session=session),
                                 metadata=metadata)
        self._lock = threading.Lock()
        self._ended = False
        self._on_end = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self):
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass
        with self._lock:
            self._ended, on_end = True, self._on_end
        if on_end is not None:
            on_end()

    def when_ended(self, on_end):
        """on_end() once the call has ended, however it ends (now, if it has)."""
        with self._lock:
            ended = self._ended
            self._on_end = on_end
        if ended:
            on_end()

    def end(self):
        self._call.cancel()
        self._thread.join()
