"""Triton kernels that merge a decoder layer's small steps (GPU path; references in
kernels/layer_reference.py).

- ``rope_and_store``: from the merged q|k|v projection, rotates q and k and writes k and v into
  the KV pools at the step's slots: four launches (two rotaries, two index copies) become one.
- ``add_rms_norm``: the residual add and the next RMSNorm in one pass, returning both.

Both round like the kernels they replace (kernels/fused_ops.py and torch's add), so a model run
with them gives the same bits as one run with fused_ops alone. Nothing syncs with the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rope_and_store_kernel(
    qkv_ptr, cos_ptr, sin_ptr, slots_ptr, q_ptr, k_pool_ptr, v_pool_ptr,
    stride_qkv, stride_cos, stride_q, stride_pool,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # query heads first, then KV heads
    i = tl.arange(0, HALF)
    c = cos_ptr + token * stride_cos
    s = sin_ptr + token * stride_cos
    c1, c2 = tl.load(c + i).to(tl.float32), tl.load(c + HALF + i).to(tl.float32)
    s1, s2 = tl.load(s + i).to(tl.float32), tl.load(s + HALF + i).to(tl.float32)
    src = qkv_ptr + token * stride_qkv + head * 2 * HALF
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    dtype = q_ptr.dtype.element_ty
    r1 = (x1 * c1 - x2 * s1).to(dtype)
    r2 = (x2 * c2 + x1 * s2).to(dtype)
    if head < NUM_HEADS:
        dst = q_ptr + token * stride_q + head * 2 * HALF
        tl.store(dst + i, r1)
        tl.store(dst + HALF + i, r2)
    else:
        kv_head = head - NUM_HEADS
        slot = tl.load(slots_ptr + token).to(tl.int64)
        dst = k_pool_ptr + slot * stride_pool + kv_head * 2 * HALF
        tl.store(dst + i, r1)
        tl.store(dst + HALF + i, r2)
        v_src = src + NUM_KV_HEADS * 2 * HALF
        v_dst = v_pool_ptr + slot * stride_pool + kv_head * 2 * HALF
        tl.store(v_dst + i, tl.load(v_src + i))
        tl.store(v_dst + HALF + i, tl.load(v_src + HALF + i))


def rope_and_store(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    write_slots: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    num_heads: int,
    out: Tensor | None = None,
) -> Tensor:
    """qkv: [T, (H + 2 Hkv) * D], rows contiguous; cos, sin: [T, D] (or [T, 1, D]); pools:
    [S, Hkv, D] contiguous. Writes rotated k and v at ``write_slots``; returns rotated q
    [T, H, D]."""
    num_tokens = qkv.shape[0]
    num_kv_heads, head_dim = k_pool.shape[1], k_pool.shape[2]
    cos, sin = cos.reshape(num_tokens, head_dim), sin.reshape(num_tokens, head_dim)
    q = qkv.new_empty((num_tokens, num_heads, head_dim)) if out is None else out
    if num_tokens:
        _rope_and_store_kernel[(num_tokens, num_heads + num_kv_heads)](
            qkv, cos, sin, write_slots, q, k_pool, v_pool,
            qkv.stride(0), cos.stride(0), q.stride(0), k_pool.stride(0),
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HALF=head_dim // 2,
        )  # fmt: skip
    return q


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, normed_ptr, sum_ptr, n_cols, eps,
                         BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = sum_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(dtype)  # rounded as torch's add rounds
    tl.store(sum_ptr + row * n_cols + cols, total, mask=mask)
    t = total.to(tl.float32)
    mean_square = tl.sum(t * t, axis=0) / n_cols
    normed = (t * tl.rsqrt(mean_square + eps)).to(dtype)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(normed_ptr + row * n_cols + cols, out.to(dtype), mask=mask)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual), x + residual) for contiguous [T, hidden] tensors."""
    x, residual = x.contiguous(), residual.contiguous()
    normed, total = torch.empty_like(x), torch.empty_like(x)
    if x.shape[0]:
        _add_rms_norm_kernel[(x.shape[0],)](
            x, residual, weight, normed, total, x.shape[1], eps,
            BLOCK=triton.next_power_of_2(x.shape[1]),
        )  # fmt: skip
    return normed, total


@triton.jit
def _silu_mul_halves_kernel(x_ptr, out_ptr, n, width, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    row, col = offsets // width, offsets % width
    g = tl.load(x_ptr + row * 2 * width + col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * width + width + col, mask=mask, other=0.0).to(tl.float32)
    out = g / (1.0 + tl.exp(-g)) * u  # as kernels/fused_ops.silu_mul computes it
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul_halves(gate_up: Tensor) -> Tensor:
    """silu(gate) * up where gate_up [T, 2 I] holds gate | up per row (the merged matmul's
    output), without splitting it into two contiguous copies first."""
    gate_up = gate_up.contiguous()
    width = gate_up.shape[1] // 2
    out = gate_up.new_empty((gate_up.shape[0], width))
    n = out.numel()
    if n:
        _silu_mul_halves_kernel[(triton.cdiv(n, 1024),)](gate_up, out, n, width, BLOCK=1024)
    return out
