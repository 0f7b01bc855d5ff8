"""The model file dp-ps starts from (--init_model) and saves (--save_model):
safetensors, an 8-byte little-endian header length, a JSON header
{"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, ...}
padded with spaces to 8 bytes, then the raw little-endian float32 data."""

import json
import struct

import torch


def trained_tensors(model):
    """The module's state_dict as the float32 tensors dp-ps trains, in
    state_dict order. ValueError, naming them, for entries that are not
    float32 parameters (buffers such as BatchNorm's running statistics)."""
    state = model.state_dict(keep_vars=True)
    params = {id(p) for p in model.parameters()}
    buffers = [name for name, t in state.items() if id(t) not in params]
    if buffers:
        raise ValueError(
            f"the module has buffers ({', '.join(buffers)}): dp-ps updates its "
            "tensors with the workers' averaged gradients, and buffers have "
            "none (BatchNorm's running statistics are computed, not learned); "
            "use a module without them (e.g. GroupNorm or LayerNorm instead of "
            "BatchNorm)")
    wrong = [f"{name} ({t.dtype})" for name, t in state.items() if t.dtype != torch.float32]
    if wrong:
        raise ValueError(f"dp-ps trains float32 tensors only; these are not: {', '.join(wrong)}")
    return {name: t.detach() for name, t in state.items()}


def encode(tensors):
    """The safetensors bytes of an ordered {name: float32 tensor}."""
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)  # so that the data is 8-byte aligned
    chunks = [struct.pack("<Q", len(text)), text]
    for t in tensors.values():
        chunks.append(t.contiguous().cpu().numpy().astype("<f4").tobytes())
    return b"".join(chunks)


def save_init(model, path):
    """Writes the module's float32 parameters, in state_dict order, as the
    safetensors file dp-ps starts from (dp-ps --init_model=path)."""
    data = encode(trained_tensors(model))
    with open(path, "wb") as f:
        f.write(data)


def load(path):
    """{name: tensor} of a float32 safetensors file (e.g. dp-ps --save_model's),
    for model.load_state_dict()."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        if h["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {h['dtype']}, not F32")
        b, e = h["data_offsets"]
        values = torch.frombuffer(bytearray(data[8 + n + b:8 + n + e]), dtype=torch.float32)
        out[name] = values.reshape(h["shape"])
    return out
