"""The MLPs of dp-ps in PyTorch, as common/model_layout.h defines them:
fc1..fcL with ReLU between, and SimpleNet (784-256-128-10). The model of
the torch baselines in bench/."""
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.depth = len(dims) - 1
        for i in range(self.depth):
            setattr(self, f"fc{i + 1}", nn.Linear(dims[i], dims[i + 1]))

    def forward(self, x):
        for i in range(1, self.depth):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return getattr(self, f"fc{self.depth}")(x)


class SimpleNet(Mlp):
    def __init__(self):
        super().__init__([784, 256, 128, 10])
