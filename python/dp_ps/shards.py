"""A job's dp-ps shards as one parameter server, as worker/ps_group.cc
speaks to them: shard 0 leads (it admits the rank, plans the blocks and
waits for the step), every push goes to the other shards first, and the
new weights come from every shard. A join brings the shards to one step,
rolling them back to the newest step all of them can restore when one
restarted from an older checkpoint. One address: one dp-ps."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from . import errors, step_channel
from ._proto import dp_pb2
from .ps_client import PsClient

STAND_BY_POLL_S = 0.25
MAX_JOIN_ROUNDS = 20


def common_step(shards, limit):
    """The newest step <= limit every shard is at or can restore (0 always
    is); -1 when none."""
    candidates = {0}
    for s in shards:
        candidates.add(s.step)
        candidates.update(s.shard.restorable_steps)
    for step in sorted(candidates, reverse=True):
        if step <= limit and all(s.step == step or step == 0 or step in s.shard.restorable_steps
                                 for s in shards):
            return step
    return -1


def plan_join(shards):
    """(join, step, version): join at `step` (pulling `version` when the
    shards ahead by one serve the one before theirs), or roll back to it."""
    steps = [s.step for s in shards]
    lo, hi = min(steps), max(steps)
    if lo == hi:
        return True, lo, None
    ahead_hold_previous = all(s.shard.holds_previous for s in shards if s.step != lo)
    # Only while shard 0 is at the older step: it plans that step's blocks.
    if hi == lo + 1 and ahead_hold_previous and shards[0].step == lo:
        return True, lo, lo
    target = common_step(shards, lo)
    if target < 0:
        raise errors.WorkerFailure(f"the shards are at steps {steps} and share no step to roll back to")
    return False, target, None


class ShardGroup:
    def __init__(self, addresses, **client_options):
        self.clients = [PsClient(a, **client_options) for a in addresses]
        # Serialized bytes (sent, received) of the last push_pull, as
        # dp-worker counts them: headers alone over shared memory.
        self.wire_bytes = [0, 0]
        self.order = list(range(len(self.clients)))  # client of shard k
        self.ranges = [(0, 0)] * len(self.clients)  # (offset, length) by shard
        self._pool = ThreadPoolExecutor(len(self.clients)) if len(self.clients) > 1 else None
        self._join_version = None
        self.channel_exchanges = 0  # push_pulls answered through the step channel
        # gRPC calls of steps' exchanges (Push, Pull, PushPull) to any shard:
        # none in a healthy job over shared memory with step channels.
        self.step_calls = 0
        self._calls_lock = threading.Lock()

    def shard(self, k):
        return self.clients[self.order[k]]

    def close(self):
        for c in self.clients:
            c.close()
        if self._pool:
            self._pool.shutdown()

    def _each(self, call, ks):
        """call(k) for every shard k in ks, concurrently; the job's failure
        first, then the first error by shard."""
        if self._pool is not None and len(ks) > 1:
            pending, get = [self._pool.submit(call, k) for k in ks], lambda f: f.result()
        else:
            pending, get = ks, call
        results = []
        for item in pending:
            try:
                results.append(get(item))
            except errors.DpError as e:
                results.append(e)
        failed = [r for r in results if isinstance(r, errors.DpError)]
        for e in failed:
            if isinstance(e, errors.JobFailed):
                raise e
        if failed:
            raise failed[0]
        return results

    def get_status(self):
        """Shard 0's status (the job's), or the first that answers."""
        first, last = None, None
        for c in self.clients:
            try:
                s = c.call("GetStatus", dp_pb2.GetStatusRequest())
            except errors.DpError as e:
                last = e
                continue
            if s.shard.index == 0:
                return s
            first = first or s
        if first is None:
            raise last
        return first

    def _register_all(self, request, leader):
        """Every shard's RegisterResponse, by shard index."""
        n = len(self.clients)

        def reg(a):
            return leader if a == self.order[0] else self.clients[a].register(request)
        by_address = self._each(reg, list(range(n)))
        order = [-1] * n
        for a, r in enumerate(by_address):
            if r.shard.count != n:
                raise errors.ConfigError(f"ps names {n} dp-ps address(es), but "
                                         f"{self.clients[a].address} is shard {r.shard.index} of {r.shard.count}")
            if order[r.shard.index] >= 0:
                raise errors.ConfigError(f"two addresses are both shard {r.shard.index}")
            order[r.shard.index] = a
        by_shard = [by_address[a] for a in order]
        end = 0
        for k, r in enumerate(by_shard):
            if r.shard.offset != end or r.config != by_shard[0].config:
                raise errors.ConfigError(f"{self.clients[order[k]].address} is not a shard of "
                                         "the job shard 0 runs")
            end = r.shard.offset + r.shard.length
        if end != by_shard[0].num_params:
            raise errors.ConfigError(f"the shards hold [0, {end}) of the model's "
                                     f"{by_shard[0].num_params} parameters")
        self.order = order
        self.ranges = [(r.shard.offset, r.shard.length) for r in by_shard]
        return by_shard

    def _attempt(self, request):
        leader = self.shard(0).register(request)
        follower_request = dp_pb2.RegisterRequest()
        follower_request.CopyFrom(request)
        follower_request.rank, follower_request.any_rank = leader.rank, False
        try:
            return self._register_all(follower_request, leader)
        except errors.DpError as e:
            if getattr(e, "code", None) == grpc.StatusCode.RESOURCE_EXHAUSTED:
                # Another shard still knows a live holder: give the rank back.
                self.shard(0).end_attendance()
            raise

    def _stand_by(self, request, give_up):
        """Registers until the answer is other than RESOURCE_EXHAUSTED (the
        rank held by another live process, or no rank free) or give_up."""
        said = False
        while True:
            try:
                return self._attempt(request)
            except errors.DpError as e:
                if getattr(e, "code", None) != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() >= give_up:
                    raise
                if not said:
                    print(f"{e}; standing by", flush=True)
                said = True
                time.sleep(STAND_BY_POLL_S)

    def register(self, request, retry_for_s):
        """Joins every shard at one step: (shard 0's RegisterResponse, step)."""
        self._join_version = None
        give_up = time.monotonic() + retry_for_s if request.any_rank else float("inf")
        for round_ in range(MAX_JOIN_ROUNDS):
            time.sleep(0.01 * round_)  # another worker may be rolling back too
            all_ = self._stand_by(request, give_up)
            join, step, version = plan_join(all_)
            if not join and self._moved_while_registering(all_):
                # Asked one after another while the job ran on: the shards
                # are together, only seen apart. Join at the newest version.
                join, step, version = True, all_[0].step, None
            if join:
                self._join_version = version
                return all_[0], step
            print(f"rank {all_[0].rank}: the shards are at steps {[s.step for s in all_]}: "
                  f"rolling them back to step {step}", flush=True)
            try:
                self._each(lambda k: all_[k].step == step or self.shard(k).call(
                    "Rollback", dp_pb2.RollbackRequest(step=step, generation=all_[k].shard.generation)),
                    list(range(len(all_))))
            except errors.DpError as e:
                if getattr(e, "code", None) != grpc.StatusCode.ABORTED:
                    raise
        raise errors.WorkerFailure(f"the shards did not settle on one step in {MAX_JOIN_ROUNDS} rounds")

    def _moved_while_registering(self, shards):
        """Whether shards a registration found apart were only seen apart,
        as dp-worker decides it: shard 0 is asked first, and no follower is
        behind it or more than a step ahead of it at any one time, so
        followers at or past its step with shard 0 since past the step it
        answered are a job that moved on meanwhile, not a shard restarted
        behind the others (which stays behind: the job cannot move)."""
        if any(s.step < shards[0].step for s in shards):
            return False
        return self._leader_past(shards[0].step)

    def _leader_past(self, step):
        try:
            return self.shard(0).call("GetStatus", dp_pb2.GetStatusRequest()).step > step
        except errors.DpError:
            return False

    def pull(self, rank, flat):
        """The newest weights (the join's version once) into `flat`: the
        PullResponse of shard 0."""
        version, self._join_version = self._join_version, None
        request = dp_pb2.PullRequest(rank=rank, offset=self.ranges[0][0],
                                     weights_in_shm=self.shard(0).plane is not None)
        if version is not None:
            request.version = version
        head = self.shard(0).call("Pull", request)
        self._pull_followers(rank, head.step, flat)
        self._write(0, head, flat)
        return head

    def _step_call(self, k, method, request, timeout_s=None):
        """A gRPC call of a step's exchange to shard k, counted."""
        with self._calls_lock:
            self.step_calls += 1
        return self.shard(k).call(method, request, timeout_s)

    def _over_channel(self, k, kind, request, timeout_s):
        """`request` (a PushRequest, or the version asked for) of `kind`
        through shard k's step channel: the PullResponse the call would have
        answered; None without a channel, or once dp-ps went away under the
        wait (gRPC then retries it, and tells whether the dp-ps that answers
        knows this registration)."""
        client = self.shard(k)
        channel = client.plane.channel if client.plane is not None else None
        if channel is None:
            return None
        try:
            return _through(channel, kind, request, timeout_s)
        except errors.DpError as e:
            if getattr(e, "code", None) != grpc.StatusCode.UNAVAILABLE:
                raise
            client.plane.drop_channel()
            return None

    def _push(self, k, request):
        """A follower's push: through its step channel, else a Push call."""
        client = self.shard(k)
        if self._over_channel(k, step_channel.PUSH, request, client.call_timeout_s) is None:
            self._step_call(k, "Push", request)

    def _pull_followers(self, rank, version, flat):
        def pull(k):
            client = self.shard(k)
            try:
                r = self._over_channel(k, step_channel.PULL, version, client.call_timeout_s)
            except errors.DpError as e:
                # Any version but the current one is gRPC's to serve (the
                # one before, in a message) or to refuse.
                if getattr(e, "code", None) != grpc.StatusCode.ABORTED:
                    raise
                r = None
            through = r is not None
            if not through:
                r = self._step_call(k, "Pull", dp_pb2.PullRequest(
                    rank=rank, offset=self.ranges[k][0], version=version,
                    weights_in_shm=client.plane is not None))
            if r.step != version:
                e = errors.WorkerFailure(f"the shards answered with versions {version} and {r.step}: re-sync")
                e.code = grpc.StatusCode.ABORTED
                raise e
            self._write(k, r, flat)
            return 0 if through else r.ByteSize()
        try:
            self.wire_bytes[1] += sum(self._each(pull, list(range(1, len(self.clients)))))
        except errors.DpError as e:
            # A follower without the version shard 0 gave a moment ago, with
            # shard 0 past it now: the job moved on in between, and pulling
            # again gets the newest (moved_on); a shard behind stays the
            # join's to mend.
            if getattr(e, "code", None) == grpc.StatusCode.ABORTED and self._leader_past(version):
                e.moved_on = True
            raise

    def _write(self, k, response, flat):
        offset, length = self.ranges[k]
        if response.params_in_shm:
            plane = self.shard(k).plane
            if plane is None:
                raise errors.WorkerFailure(f"dp-ps at {self.shard(k).address} answered with weights "
                                           "in shared memory this worker does not have")
            plane.read_weights(response.step, flat[offset:offset + length])
            return
        if response.encoding != dp_pb2.ENCODING_F32 or len(response.params) != 4 * length:
            raise errors.WorkerFailure(
                f"dp-ps at {self.shard(k).address} sent {len(response.params)} bytes of weights "
                f"({dp_pb2.Encoding.Name(response.encoding)}); its range holds {length} float32 values")
        flat[offset:offset + length] = np.frombuffer(response.params, dtype="<f4")

    def push_pull(self, request, gradient, flat):
        """Pushes each shard its range of `gradient` (float32 values), waits
        for the step and gathers the new weights into `flat` (unless the
        answer is more work). shard 0's PullResponse."""
        def request_for(k):
            r = dp_pb2.PushRequest()
            r.CopyFrom(request)
            offset, length = self.ranges[k]
            r.offset = offset
            plane = self.shard(k).plane
            r.weights_in_shm = plane is not None
            if r.idle:
                return r
            if plane is None:
                r.gradient = gradient[offset:offset + length].tobytes()
            else:
                # dp-ps has read the slot's last gradient before it answered.
                plane.write_gradient(gradient[offset:offset + length])
                r.gradient_in_shm, r.shm_slot = True, plane.slot_id
            return r
        requests = [request_for(k) for k in range(len(self.clients))]
        # Through a step channel an exchange is no message at all.
        self.wire_bytes = [sum(r.ByteSize() for k, r in enumerate(requests) if not self._has_channel(k)), 0]
        if not request.idle:
            self._each(lambda k: self._push(k, requests[k]), list(range(1, len(self.clients))))
        head_request = requests[0]
        lead = self.shard(0)
        while True:
            try:
                had_channel = self._has_channel(0)
                head = self._over_channel(0, step_channel.PUSH_PULL, head_request, lead.wait_timeout_s)
                if head is not None:
                    self.channel_exchanges += 1
                else:
                    if had_channel:
                        self.wire_bytes[0] += head_request.ByteSize()
                    head = self._step_call(0, "PushPull", head_request, lead.wait_timeout_s)
                    self.wire_bytes[1] += head.ByteSize()
                break
            except errors.DpError as e:
                if getattr(e, "code", None) != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                # The push is recorded, or sent again with the same bytes:
                # dp-ps counts a repeat once.
                print(f"rank {request.rank}: still waiting at step {request.step}", flush=True)
        if not head.work_only:
            self._pull_followers(request.rank, head.step, flat)
            self._write(0, head, flat)
        return head

    def report_eval(self, request):
        return self.shard(0).call("ReportEval", request)


    def _has_channel(self, k):
        plane = self.shard(k).plane
        return plane is not None and plane.channel is not None


def _through(channel, kind, request, timeout_s):
    """A request through the step channel - a PushRequest, or for PULL the
    version asked for - as the PullResponse the call would have answered
    (weights in shared memory, or work only)."""
    if kind == step_channel.PULL:
        a = channel.call(request, (0, 0), 0.0, 0, False, timeout_s, kind)
    else:
        a = channel.call(request.step, (request.block.first, request.block.count), request.loss,
                         request.num_samples, request.idle, timeout_s, kind)
    return dp_pb2.PullResponse(step=a.step, done=a.done, params_in_shm=not a.work_only,
                               block=dp_pb2.Block(first=a.block[0], count=a.block[1]),
                               work_only=a.work_only)
