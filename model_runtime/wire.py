"""Tensors on the wire: raw little-endian bytes + dtype name + shape (never pickle)."""

from __future__ import annotations

import math

import torch

from protos import tensor_pb2

_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def tensor_to_pb(t: torch.Tensor) -> tensor_pb2.Tensor:
    if t.dtype not in _NAMES:
        raise ValueError(f"dtype {t.dtype} cannot travel on the wire")
    host = t.detach()
    if host.device.type != "cpu":
        host = host.to("cpu")
    host = host.contiguous()
    raw = host.view(torch.uint8).numpy().tobytes() if host.numel() else b""
    return tensor_pb2.Tensor(data=raw, dtype=_NAMES[t.dtype], shape=list(t.shape))


def tensor_from_pb(msg: tensor_pb2.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise ValueError(f"unknown wire dtype {msg.dtype!r}")
    shape = tuple(msg.shape)
    expected = math.prod(shape) * dtype.itemsize
    if len(msg.data) != expected:
        raise ValueError(
            f"tensor of shape {shape} and {msg.dtype} needs {expected} bytes, got {len(msg.data)}"
        )
    if expected == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    flat = torch.frombuffer(bytearray(msg.data), dtype=dtype)
    return flat.reshape(shape).to(device)
