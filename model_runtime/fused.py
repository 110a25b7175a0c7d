"""Which implementation the model's small ops use: fused Triton kernels on CUDA, torch elsewhere.

The choice is made once per process (``use_fused_kernels``, from the service's config) and
holds for every step, so a request's decode, verify and prefill steps share one numerics.
"""

from __future__ import annotations

import importlib.util

import torch

from kernels import fused_reference

_enabled = False


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_fused_kernels(enabled: bool) -> bool:
    """Turns the fused kernels on (for CUDA tensors) when triton is importable; returns the
    resulting state."""
    global _enabled
    _enabled = enabled and triton_available()
    return _enabled


def _fused(x: torch.Tensor) -> bool:
    return _enabled and x.is_cuda


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x):
        from kernels import fused_ops

        return fused_ops.rms_norm(x, weight, eps)
    return fused_reference.rms_norm(x, weight, eps)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if _fused(x) and x.dim() == 3:  # [T, heads, head_dim]; training's 4-D batches stay torch
        from kernels import fused_ops

        return fused_ops.rotary(x, cos, sin)
    return fused_reference.rotary(x, cos, sin)


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The first index of each row's maximum, [R] int64 (into ``out`` if given)."""
    if _fused(logits):
        from kernels import argmax as argmax_kernel

        return argmax_kernel.argmax_rows(logits, out)
    ids = logits.argmax(-1)
    return ids if out is None else out.copy_(ids)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _fused(gate):
        from kernels import fused_ops

        return fused_ops.silu_mul(gate, up)
    return fused_reference.silu_mul(gate, up)
