#!/usr/bin/env python3
"""Writes tests/golden/user_mlp/: a user's own MLP (20-64-32-3) trained by
PyTorch itself, for tests/torch_equivalence_test.cc.

  train_x.npy, train_y.npy  256 samples of 20 float32 features, labels 0..2
  init.safetensors          the initial weights (fc1..fc3, nn.Linear names)
  trained.safetensors       the weights after 20 steps of torch.optim.AdamW
                            (lr 0.01, weight_decay 0.05), warm-up 5 steps then
                            cosine to lr_min 0.001 over the 20 steps (LambdaLR
                            stepped after every optimizer.step()), gradients
                            clipped to global norm 0.5 (clip_grad_norm_; most steps are), a
                            global batch of 32 in file order (no shuffling:
                            step t takes samples 32*(t mod 8) .. +32).

dp-ps runs the same job (--layers=20,64,32,3 --dataset=npy --shuffle=false,
2 workers x 16) and must end within a relative 1e-4 of trained.safetensors:
its micro-batch sums are added in another order than torch's batch sum.

Regenerate (Debian's python3-torch 1.13.1 and python3-numpy):
  /usr/bin/python3 tests/golden/make_user_mlp_golden.py
"""
import json
import math
import os
import struct

import numpy as np
import torch

LAYERS = [20, 64, 32, 3]
N, BATCH, STEPS = 256, 32, 20
LR, LR_MIN, WD, WARMUP, CLIP = 0.01, 0.001, 0.05, 5, 0.5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "user_mlp")


def save_safetensors(path, tensors):
    """tensors: list of (name, float32 ndarray), in the file's order."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors:
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.RandomState(20261203)
    y = (np.arange(N) % LAYERS[-1]).astype(np.int64)
    x = rng.standard_normal((N, LAYERS[0])).astype(np.float32)
    for k in range(LAYERS[0]):
        x[y == k % LAYERS[-1], k] += 2.0  # a pattern an MLP can learn
    np.save(os.path.join(OUT, "train_x.npy"), x)
    np.save(os.path.join(OUT, "train_y.npy"), y)

    torch.manual_seed(3)
    layers = []
    for i in range(len(LAYERS) - 1):
        layers.append(torch.nn.Linear(LAYERS[i], LAYERS[i + 1]))
        if i + 2 < len(LAYERS):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]

    def named():
        out = []
        for i, m in enumerate(linears):
            out.append((f"fc{i + 1}.weight", m.weight.detach().numpy()))
            out.append((f"fc{i + 1}.bias", m.bias.detach().numpy()))
        return out

    save_safetensors(os.path.join(OUT, "init.safetensors"), named())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)

    def factor(t):  # lr_t / lr for the update of step t
        warm = min(1.0, (t + 1) / WARMUP)
        base = LR_MIN + (LR - LR_MIN) * 0.5 * (1 + math.cos(math.pi * t / STEPS))
        return warm * base / LR

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    steps_per_epoch = N // BATCH
    clipped = 0
    for t in range(STEPS):
        g = t % steps_per_epoch
        xb, yb = xs[g * BATCH:(g + 1) * BATCH], ys[g * BATCH:(g + 1) * BATCH]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        clipped += int(norm.item() > CLIP)
        opt.step()
        sched.step()
    print(f"loss at step {STEPS - 1}: {loss.item():.6f}; "
          f"{clipped} of {STEPS} steps clipped")
    save_safetensors(os.path.join(OUT, "trained.safetensors"), named())


if __name__ == "__main__":
    main()
