"""The tests' modules: dp-ps's MLP as torch writes it (fc1, fc2, ... with
ReLU between; "mlp_last_first" the same with its layers made last to first), and a small CNN (two Conv2d and a Linear) on 28x28 images."""

import torch
import torch.nn as nn


class Mlp(nn.Module):
    def __init__(self, widths, last_first=False):
        super().__init__()
        self.n = len(widths) - 1
        # last_first: the layers made last to first, so that state_dict()
        # lists fc3 before fc1 (the job's tensors in another order).
        for i in reversed(range(self.n)) if last_first else range(self.n):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        for i in range(1, self.n + 1):
            x = getattr(self, f"fc{i}")(x)
            x = torch.relu(x) if i < self.n else x
        return x


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, stride=2)   # 28x28 -> 12x12
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)  # -> 5x5
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def make(kind, widths="784,256,128,10", seed=0):
    """A fresh module, its parameters drawn from torch's generator at `seed`."""
    torch.manual_seed(seed)
    if kind == "cnn":
        return Cnn()
    return Mlp([int(w) for w in widths.split(",")], last_first=kind == "mlp_last_first")
