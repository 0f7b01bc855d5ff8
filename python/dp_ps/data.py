"""Fashion-MNIST (or MNIST) as dp-worker reads it: IDX files, gzipped or
not; each image 784 float32 features (p / 255 - 0.2860) / 0.3530, the
label an int64. It carries dp-worker's data fingerprint, so Python and C++
workers on the same files join one job."""

import gzip
import os
import struct

import torch

from .fingerprint import _FNV_OFFSET, fnv1a

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def _read_idx(directory, base, magic):
    for path in (os.path.join(directory, base + ".gz"), os.path.join(directory, base)):
        if os.path.exists(path):
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rb") as f:
                data = f.read()
            if len(data) < 8 or struct.unpack(">I", data[:4])[0] != magic:
                raise ValueError(f"{path} is not an IDX file (magic {magic:#x})")
            return path, data
    raise FileNotFoundError(f"neither {base}.gz nor {base} is in {directory}")


class IdxDataset(torch.utils.data.Dataset):
    """split "train" or "test" of the IDX files in `directory`."""

    def __init__(self, directory=DEFAULT_DIR, split="train"):
        prefix = {"train": "train", "test": "t10k"}[split]
        images_path, images = _read_idx(directory, prefix + "-images-idx3-ubyte", 0x803)
        labels_path, labels = _read_idx(directory, prefix + "-labels-idx1-ubyte", 0x801)
        n, rows, cols = struct.unpack(">III", images[4:16])
        if rows * cols != 784 or len(images) != 16 + n * 784:
            raise ValueError(f"{images_path} holds {n} images of {rows}x{cols}: "
                             "expected 784 pixels per image, whole")
        if struct.unpack(">I", labels[4:8])[0] != n or len(labels) != 8 + n:
            raise ValueError(f"{images_path} and {labels_path} hold different counts")
        pixels = torch.frombuffer(bytearray(images[16:]), dtype=torch.uint8).reshape(n, 784)
        # float32 arithmetic, as NormalisedPixel's: the same features to the bit.
        table = (torch.arange(256, dtype=torch.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
        self.x = table[pixels.long()]
        self.y = torch.frombuffer(bytearray(labels[8:]), dtype=torch.uint8).long()
        if int(self.y.max()) >= 10:
            raise ValueError(f"{labels_path} has a label outside [0, 10)")
        # dp-worker's: FNV-1a over the pixel bytes, then the label bytes.
        self.fingerprint = (n, fnv1a(fnv1a(_FNV_OFFSET, images[16:]), labels[8:]))

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return self.x[i], self.y[i]
