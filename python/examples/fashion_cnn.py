#!/usr/bin/env python3
"""A small CNN (two Conv2d and a Linear) on Fashion-MNIST, trained with
dp-ps holding its weights and Adam state (README: "Train a PyTorch model").

  fashion_cnn.py init FILE     writes the CNN's initial weights for dp-ps --init_model
  fashion_cnn.py train HOST:PORT [auto|shm|grpc]
                               one worker of the job (run one per worker); the
                               data plane as dp-worker's --data_plane (auto)
"""

import sys

import torch
import torch.nn as nn

import dp_ps


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5, stride=2)   # 28x28 -> 12x12
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2)  # -> 5x5
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x.view(-1, 1, 28, 28)))
        x = torch.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def main(argv):
    if not (len(argv) == 3 or (len(argv) == 4 and argv[1] == "train")) or argv[1] not in ("init", "train"):
        print(__doc__, file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = Cnn()
    if argv[1] == "init":
        dp_ps.save_init(model, argv[2])
        return 0
    torch.set_num_threads(1)
    summary = dp_ps.train(model, dp_ps.IdxDataset(), argv[2],
                          test_set=dp_ps.IdxDataset(split="test"),
                          data_plane=argv[3] if len(argv) == 4 else "auto")
    print(f"rank {summary['rank']}: {summary['steps']} steps, last loss {summary['last_loss']:.4f}"
          + (f", test accuracy {summary['test_accuracy']:.4f}" if "test_accuracy" in summary else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
