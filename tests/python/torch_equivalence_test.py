#!/usr/bin/env python3
"""python_torch_equivalence: 20 steps of a small CNN trained through dp-ps
by 2 Python workers end within a relative 1e-4 of torch.optim.Adam's own
training of the same module in one process, from the same init and on the
same samples in the same order (dp_ps's data order, read back from the
job's configuration). Each step's gradient there is one backward pass over
the whole global batch; through dp-ps it is four micro-batches' mean
gradients, summed in the tree's order and averaged by dp-ps: the same
number up to float32 rounding, which is what the tolerance is for.

Usage: torch_equivalence_test.py --ps BIN --worker BIN --source_dir DIR
"""

import os
import sys

import torch
import torch.nn.functional as F

import harness
import models
import dp_ps
from dp_ps.data_order import BatchSampler, Schedule

STEPS = 20
TOLERANCE = 1e-4


def reference(config, train_set):
    """The CNN after STEPS steps of torch.optim.Adam on the job's batches."""
    model = models.make("cnn")
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    sampler = BatchSampler(Schedule.of_job(config, len(train_set)))
    micro = config.micro_batches
    for step in range(STEPS):
        indices = [i for j in range(micro) for i in sampler.indices(step, j)]
        opt.zero_grad()
        F.cross_entropy(model(train_set.x[indices]), train_set.y[indices]).backward()
        opt.step()
    return model.state_dict()


def relative_error(got, want):
    """max |got - want| over max |want|, tensor by tensor: the worst."""
    return max(float((got[n] - want[n]).abs().max() / want[n].abs().max()) for n in want)


def main():
    a = harness.args()
    checks = harness.Checks()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    with harness.temp_dir() as d:
        init, saved = os.path.join(d, "init.safetensors"), os.path.join(d, "model.safetensors")
        dp_ps.save_init(models.make("cnn"), init)
        ps, address = harness.start_ps(a.ps, [
            # --min_workers: the first step waits for both, however long
            # their import of torch takes (jobs_test.py's reason).
            "--workers=2", "--min_workers=2", "--micro_batch=16", "--global_batch=64", f"--max_steps={STEPS}",
            "--seed=5", f"--init_model={init}", f"--save_model={saved}"])
        if not checks.check(address is not None, "dp-ps starts"):
            return checks.result()
        config = harness.status(address).config
        workers = [harness.start_python_worker(f"python worker {i}", address,
                                               ["--model", "cnn", "--no_test_set"])
                   for i in range(2)]
        harness.finish(checks, workers + [ps])
        if not checks.check(os.path.exists(saved), "dp-ps saved the model"):
            return checks.result()
        got = dp_ps.load(saved)
        want = reference(config, dp_ps.IdxDataset())
        checks.check(sorted(got) == sorted(want), "the saved model has the module's tensors")
        error = relative_error(got, want)
        moved = relative_error(models.make("cnn").state_dict(), want)
        print(f"      relative error after {STEPS} steps: {error:.3g} "
              f"(the init is {moved:.3g} from the result)", flush=True)
        checks.check(error <= TOLERANCE, f"dp-ps's model is within {TOLERANCE} of torch.optim.Adam's")
        checks.check(moved > 100 * TOLERANCE, "the training moved the weights far beyond the tolerance")
    return checks.result()


if __name__ == "__main__":
    sys.exit(main())
