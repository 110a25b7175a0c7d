"""Fused Triton kernels for the GPU decode path: RMSNorm, rotary embedding, SiLU-and-multiply.

A decode step of a small model is a long chain of tiny kernels (about 50 per layer for
SmolLM2, ~2.9 us each on an H200 when replayed from a CUDA graph); these three replace about 25
of them per layer. Each computes in fp32 and rounds once to the tensor's dtype, so its bits may
differ from the torch composition in fused_reference.py (which rounds after every op) by an
ulp: the model uses one or the other for every step of a run, never both. Nothing here syncs
with the host, so the kernels may sit inside captured graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, n_cols, eps,
                     BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    normed = (x * tl.rsqrt(mean_square + eps)).to(out_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    out = normed.to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``out`` (optional, x's shape, contiguous) receives the result; tests pass a poisoned one."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty_like(rows) if out is None else out.view(rows.shape)
    block = triton.next_power_of_2(rows.shape[1])
    _rms_norm_kernel[(rows.shape[0],)](
        rows, weight, out, rows.stride(0), out.stride(0), rows.shape[1], eps, BLOCK=block
    )
    return out.view(x.shape)


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_t, stride_h, stride_c,
                   HALF: tl.constexpr):  # fmt: skip
    token = tl.program_id(0)
    head = tl.program_id(1)
    i = tl.arange(0, HALF)
    base = token * stride_t + head * stride_h
    x1 = tl.load(x_ptr + base + i).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + i).to(tl.float32)
    c = cos_ptr + token * stride_c
    s = sin_ptr + token * stride_c
    c1, c2 = tl.load(c + i).to(tl.float32), tl.load(c + HALF + i).to(tl.float32)
    s1, s2 = tl.load(s + i).to(tl.float32), tl.load(s + HALF + i).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + base + i, (x1 * c1 - x2 * s1).to(dtype))
    tl.store(out_ptr + base + HALF + i, (x2 * c2 + x1 * s2).to(dtype))


def rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x: [T, heads, head_dim] (head_dim a power of two); cos, sin: [T, 1, head_dim]."""
    x = x.contiguous()
    out = torch.empty_like(x) if out is None else out
    num_tokens, num_heads, head_dim = x.shape
    cos, sin = cos.reshape(num_tokens, head_dim), sin.reshape(num_tokens, head_dim)
    _rotary_kernel[(num_tokens, num_heads)](
        x, cos, sin, out, x.stride(0), x.stride(1), cos.stride(0), HALF=head_dim // 2
    )
    return out


@triton.jit
def _silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate) if out is None else out
    n = gate.numel()
    _silu_mul_kernel[(triton.cdiv(n, 1024),)](gate, up, out, n, BLOCK=1024)
    return out
