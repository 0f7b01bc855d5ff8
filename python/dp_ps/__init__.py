"""Train any torch.nn.Module with dp-ps holding its weights and Adam state
(docs/python.md)."""

from . import errors
from .data import IdxDataset
from .ps_client import Tls
from .safetensors import load, save_init
from .train import block_gradient, evaluate, train
from .worker import Worker

__all__ = ["errors", "IdxDataset", "Tls", "load", "save_init", "train", "block_gradient",
           "evaluate", "Worker"]
