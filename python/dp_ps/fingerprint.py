"""What a worker tells dp-ps at Register so that dp-ps refuses one whose
model or data differ from the job's: the model's tensor names and shapes,
and the training data (its size and a hash)."""

import struct

import torch

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1

# Samples of a data set without a fingerprint of its own that its hash
# covers, evenly spaced: a pass over a large data set would cost minutes.
SAMPLES_HASHED = 64


def fnv1a(h, data):
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def model_fingerprint(specs):
    """FNV-1a over the (name, shape) of every tensor as ModelLayout's
    Fingerprint mixes them: each character and each dimension as a
    little-endian uint64."""
    h = _FNV_OFFSET
    for name, shape in specs:
        for c in name.encode():
            h = fnv1a(h, struct.pack("<Q", c))
        for d in shape:
            h = fnv1a(h, struct.pack("<Q", d & _MASK))
    return h


def data_fingerprint(dataset, data_id=None):
    """(num_samples, hash) of a map-style data set. One that carries a
    `fingerprint` of its own (IdxDataset: dp-worker's, so that both kinds
    of worker join one job) gives it; otherwise the hash is FNV-1a over
    data_id's UTF-8 bytes, then the float32 bytes of x and the int64 label
    y of SAMPLES_HASHED samples spread evenly over the set. data_id, when
    given, is mixed into either."""
    n = len(dataset)
    own = getattr(dataset, "fingerprint", None)
    if own is not None:
        h = own[1] if data_id is None else fnv1a(own[1], data_id.encode())
        return n, h
    h = fnv1a(_FNV_OFFSET, (data_id or "").encode())
    count = min(n, SAMPLES_HASHED)
    for i in range(count):
        x, y = dataset[i * n // count]
        h = fnv1a(h, torch.as_tensor(x, dtype=torch.float32).contiguous().numpy().tobytes())
        h = fnv1a(h, struct.pack("<q", int(y)))
    return n, h
