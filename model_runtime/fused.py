"""Which implementation the model's small ops use: fused Triton kernels on CUDA; on a CPU in
float32 the C++ row ops (kernels/row_ops.h) once the CPU kernel module is loaded; torch
elsewhere (and wherever autograd is on: training keeps torch's ops).

The choice is made once per process (``use_fused_kernels``, from the service's config;
``use_cpu_row_ops``, when the CPU kernels load) and holds for every step, so a request's
decode, verify and prefill steps share one numerics.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
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
    ids = greedy_ids(logits)
    return ids if out is None else out.copy_(ids)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, any leading dims. On a CPU step the C++ row op, which gives
    torch's ids (the first maximum; NaN counts as one) ~15x sooner: torch's took 0.3-0.8 ms of
    a 9-node verify over the default model's 49,152 columns. CUDA keeps torch's (graphs capture
    it; ``argmax`` above has the Triton kernel)."""
    if not _cpu_row_op(logits) or logits.dim() == 0 or logits.shape[-1] == 0:
        return logits.argmax(-1)
    rows = _cpu_rows.argmax_rows(logits.reshape(-1, logits.shape[-1]))  # type: ignore[union-attr]
    return rows.view(logits.shape[:-1])


def softmax_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely columns of softmax(logits) per row: (probabilities in fp32 or wider,
    int64 ids), sorted descending (on the CPU row op, of equal ones the lower id first)."""
    if _fused(logits) and logits.dtype != torch.float64:
        from kernels import softmax_topk as topk_kernel

        return topk_kernel.softmax_topk(logits, k)
    if _cpu_row_op(logits) and logits.dim() >= 1 and 1 <= k <= logits.shape[-1]:
        # A drafter's search step: torch's softmax then topk took ~90 us over 4 rows of the
        # shipped head's 16,384 hot tokens, the row op ~25 us.
        flat = logits.reshape(-1, logits.shape[-1])
        probs, ids = _cpu_rows.softmax_topk(flat, k)  # type: ignore[union-attr]
        return probs.view(*logits.shape[:-1], k), ids.view(*logits.shape[:-1], k)
    wide = torch.promote_types(logits.dtype, torch.float32)  # the cast is in the softmax
    return torch.softmax(logits, dim=-1, dtype=wide).topk(k, dim=-1)


def compact_accepted(
    pools: Sequence[torch.Tensor], node_slots: torch.Tensor, path: torch.Tensor, dummy_slot: int
) -> None:
    """``kernels.tree_ops.compact_accepted``: on a CPU step one C++ call for every pool, where
    torch's reference takes an index_select and an index_copy_ per pool (61 of each a verify of
    the default model, ~0.6 ms on 2 cores); the same bytes either way."""
    from kernels import tree_ops, tree_reference

    if _cpu_rows is None or path.is_cuda or not all(p.is_contiguous() for p in pools):
        tree_ops.compact_accepted(pools, node_slots, path, dummy_slot)
        return
    src, dst = tree_reference.accepted_moves(node_slots, path, dummy_slot)
    _cpu_rows.compact_rows(list(pools), src, dst)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _fused(gate):
        from kernels import fused_ops

        return fused_ops.silu_mul(gate, up)
    return fused_reference.silu_mul(gate, up)
