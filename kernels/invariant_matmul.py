"""A batch-invariant matmul in Triton: ``x @ weight.T`` whose rows have the same bits whatever
the number of rows (the target's --exact mode on CUDA).

cuBLAS picks its kernel, tile shape and split-K by the problem's shape, so a token's row of a
1-row decode step and of a 16-row tree verify can round differently (the reason bf16
speculation changed outputs on the H200 with the torch attention). Here one configuration
serves every shape: tiles of BLOCK_M x BLOCK_N, the reduction walked in order in blocks of
BLOCK_K, never split. A row's result depends only on that row and the weight. The price is
speed at one row (a 64-row tile computes mostly padding, and no split-K spreads a long
reduction over more programs): measured in benchmarks/gpu_steps.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.dot_modes import dot, dot_mode

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 64  # fixed: part of the numerics


@triton.jit
def _matmul_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + ks
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + k[None, :],
            mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0,
        )  # fmt: skip
        w = tl.load(
            w_ptr + cols[None, :].to(tl.int64) * stride_wn + k[:, None],
            mask=(cols[None, :] < N) & (k[:, None] < K), other=0.0,
        )  # fmt: skip
        acc += dot(x, w, DOT)
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
        acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N),
    )  # fmt: skip


def matmul(x: Tensor, weight: Tensor) -> Tensor:
    """x: [M, K], weight: [N, K] (last dims contiguous); returns x @ weight.T in x's dtype."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, inner = x.shape
    cols = weight.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(cols, BLOCK_N))
    _matmul_kernel[grid](
        x, weight, out, rows, cols, inner, x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, DOT=dot_mode(x.dtype),
    )  # fmt: skip
    return out
