"""Which implementation the model's small ops use: fused Triton kernels on CUDA; on a CPU in
float32 the C++ row ops (kernels/row_ops.h) once the CPU kernel module is loaded; torch
elsewhere (and wherever autograd is on: training keeps torch's ops).

The choice is made once per process (``use_fused_kernels``, from the service's config;
``use_cpu_row_ops``, when the CPU kernels load) and holds for every step, so a request's
decode, verify and prefill steps share one numerics.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import torch

from kernels import fused_reference

_enabled = False
_cpu_rows: ModuleType | None = None  # the CPU kernel module (kernels/few_row_linear.py)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_fused_kernels(enabled: bool) -> bool:
    """Turns the fused kernels on (for CUDA tensors) when triton is importable; returns the
    resulting state."""
    global _enabled
    _enabled = enabled and triton_available()
    return _enabled


def use_cpu_row_ops(module: ModuleType | None) -> None:
    """RMSNorm and rotary of float32 CPU tensors through ``module``'s row ops from now on
    (None: torch's)."""
    global _cpu_rows
    _cpu_rows = module


def _fused(x: torch.Tensor) -> bool:
    return _enabled and x.is_cuda


def _cpu_row_op(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """On a CPU step the C++ row ops take float32 tensors one call each, where torch's
    reference is five to seven ops: about 2 of a 17 ms decode step on 2 cores."""
    if _cpu_rows is None or x.is_cuda or torch.is_grad_enabled():
        return False
    return all(t.dtype == torch.float32 for t in (x, *others))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _fused(x):
        from kernels import fused_ops

        return fused_ops.rms_norm(x, weight, eps)
    if _cpu_row_op(x, weight):
        return _cpu_rows.rms_norm(x, weight, eps)  # type: ignore[union-attr]
    return fused_reference.rms_norm(x, weight, eps)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.dim() != 3:  # [T, heads, head_dim]; training's 4-D batches stay torch
        return fused_reference.rotary(x, cos, sin)
    if _fused(x):
        from kernels import fused_ops

        return fused_ops.rotary(x, cos, sin)
    if _cpu_row_op(x, cos, sin) and cos.stride(-1) == 1 and sin.stride(-1) == 1:
        return _cpu_rows.rotary(x, cos, sin)  # type: ignore[union-attr]
    return fused_reference.rotary(x, cos, sin)


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The first index of each row's maximum, [R] int64 (into ``out`` if given)."""
    if _fused(logits):
        from kernels import argmax as argmax_kernel

        return argmax_kernel.argmax_rows(logits, out)
    ids = logits.argmax(-1)
    return ids if out is None else out.copy_(ids)


def softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely columns of softmax(logits) per row: (probabilities in fp32 or wider,
    int64 ids), sorted descending."""
    if _fused(logits) and logits.dtype != torch.float64:
        from kernels import softmax_topk as topk_kernel

        return topk_kernel.softmax_topk(logits, k)
    wide = torch.promote_types(logits.dtype, torch.float32)  # the cast is in the softmax
    return torch.softmax(logits, dim=-1, dtype=wide).topk(k, dim=-1)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _fused(gate):
        from kernels import fused_ops

        return fused_ops.silu_mul(gate, up)
    return fused_reference.silu_mul(gate, up)
