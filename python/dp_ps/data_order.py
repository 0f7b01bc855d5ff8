"""The job's global data order, a port of common/data_order.{h,cc}: epoch e
is a permutation drawn from (seed, e); global batch g of an epoch is
[g*B, (g+1)*B) of it with B = micro_batches * batch_size; micro-batch j is
its j-th batch_size slice. Any worker computes the same samples for a
(step, micro-batch) as dp-worker does."""

from dataclasses import dataclass

from .random import Rng, random_permutation

# The stream ids of epoch permutations, apart from the init streams.
_ORDER_STREAM = 0x0DE0000000000000


@dataclass
class Schedule:
    num_samples: int
    world_size: int = 1
    batch_size: int = 1
    micro_batches: int = 0  # per step; 0: world_size
    epochs: int = 1
    max_steps: int = 0  # 0: all epochs
    seed: int = 0
    shuffle: bool = True

    @classmethod
    def of_job(cls, config, num_samples):
        """The schedule of a dp.v1.JobConfig over `num_samples` samples."""
        return cls(num_samples=num_samples, world_size=config.world_size,
                   batch_size=config.batch_size, micro_batches=config.micro_batches,
                   epochs=config.epochs, max_steps=config.max_steps, seed=config.seed,
                   shuffle=config.shuffle)

    def num_micro_batches(self):
        return self.micro_batches if self.micro_batches > 0 else self.world_size

    def global_batch(self):
        return self.num_micro_batches() * self.batch_size

    def steps_per_epoch(self):
        return self.num_samples // self.global_batch()

    def total_steps(self):
        all_steps = self.epochs * self.steps_per_epoch()
        return min(all_steps, self.max_steps) if self.max_steps > 0 else all_steps

    def epoch_of(self, step):
        return step // self.steps_per_epoch()

    def ends_epoch(self, step):
        """True when `step` is the last of an epoch (or of the job)."""
        return (step + 1) % self.steps_per_epoch() == 0 or step + 1 == self.total_steps()


def epoch_order(seed, epoch, n, shuffle):
    """The sample order of `epoch`: a permutation of [0, n), or the identity."""
    if not shuffle:
        return list(range(n))
    return random_permutation(Rng(seed, _ORDER_STREAM + epoch), n)


class BatchSampler:
    """The sample indices of a step's micro-batch; keeps the current
    epoch's order (drawing one costs a pass over the data set's size)."""

    def __init__(self, schedule):
        self._s = schedule
        self._epoch = -1
        self._order = []

    def indices(self, step, micro_batch):
        s = self._s
        if not (0 <= micro_batch < s.num_micro_batches() and step >= 0):
            raise ValueError(f"micro-batch {micro_batch} of step {step} is not in the "
                             f"schedule ({s.num_micro_batches()} per step)")
        epoch = s.epoch_of(step)
        if epoch != self._epoch:
            self._order = epoch_order(s.seed, epoch, s.num_samples, s.shuffle)
            self._epoch = epoch
        g = step % s.steps_per_epoch()
        begin = g * s.global_batch() + micro_batch * s.batch_size
        return self._order[begin:begin + s.batch_size]
