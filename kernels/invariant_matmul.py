"""A batch-invariant matmul in Triton: ``x @ weight.T`` whose rows have the same bits whatever
the number of rows (the target's --exact mode on CUDA).

cuBLAS picks its kernel, tile shape and split-K by the problem's shape, so a token's row of a
1-row decode step and of a 16-row tree verify can round differently (the reason bf16
speculation changed outputs on the H200 with the torch attention). Here the shape of the
arithmetic depends on the weight alone: tiles of BLOCK_M x BLOCK_N, the reduction cut into a
number of ranges set by the weight's shape, each walked in order in blocks of BLOCK_K, the
ranges' fp32 sums added in order. A row's result depends only on that row and the weight. The
price is speed (a 64-row tile computes mostly padding at one row): measured in
benchmarks/gpu_steps.py and benchmarks/gpu_matmul_configs.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.dot_modes import dot, dot_mode

BLOCK_M, BLOCK_K = 64, 64  # fixed: part of the numerics
# A one-row step of a 4096-wide layer has only 64 column tiles of 64: too few programs to
# stream the weight at the HBM's rate. So the reduction is cut into ranges, each summed in
# order into an fp32 partial, and the partials added in range order. Column tile and number of
# ranges come from the weight's shape alone (never from the row count, which keeps the rows
# invariant); the rule below is what benchmarks/gpu_matmul_configs.py measured best on an H200
# (benchmarks/results/gpu_matmul_configs_2026-12-01.jsonl).
SMALL_WEIGHT = 1 << 22  # elements: below it 32-column tiles (the default model's layers)
TARGET_PROGRAMS = 528  # four waves of an H200's 132 SMs at one row tile
MIN_RANGE = 384  # shortest reduction range worth its partial
MAX_SPLIT = 8


@triton.jit
def _matmul_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, k_per_split, stride_xm, stride_wn, stride_om, stride_os,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_begin = split * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    for start in range(k_begin, k_end, BLOCK_K):
        k = start + ks
        x = tl.load(
            x_ptr + rows[:, None].to(tl.int64) * stride_xm + k[None, :],
            mask=(rows[:, None] < M) & (k[None, :] < k_end), other=0.0,
        )  # fmt: skip
        w = tl.load(
            w_ptr + cols[None, :].to(tl.int64) * stride_wn + k[:, None],
            mask=(cols[None, :] < N) & (k[:, None] < k_end), other=0.0,
        )  # fmt: skip
        acc += dot(x, w, DOT)
    tl.store(
        out_ptr + split.to(tl.int64) * stride_os + rows[:, None].to(tl.int64) * stride_om
        + cols[None, :],
        acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N),
    )  # fmt: skip


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, numel, num_splits, BLOCK: tl.constexpr):
    """out = part[0] + part[1] + ... in that order (fp32), cast to out's dtype."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < numel
    total = tl.load(part_ptr + offsets, mask=ok, other=0.0)
    for s in range(1, num_splits):
        total += tl.load(part_ptr + s * numel + offsets, mask=ok, other=0.0)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=ok)


def config_for(cols: int, inner: int) -> tuple[int, int]:
    """(column tile, reduction ranges) of a weight [cols, inner]: the same at any row count."""
    block_n = 32 if cols * inner < SMALL_WEIGHT else 64
    most = min(MAX_SPLIT, TARGET_PROGRAMS // triton.cdiv(cols, block_n), inner // MIN_RANGE)
    return block_n, 1 << (max(most, 1).bit_length() - 1)  # a power of two, as measured


def matmul(
    x: Tensor, weight: Tensor, block_n: int | None = None, num_splits: int | None = None
) -> Tensor:
    """x: [M, K], weight: [N, K] (last dims contiguous); returns x @ weight.T in x's dtype.

    ``block_n`` and ``num_splits`` are for benchmarks: any values kept fixed for a weight keep
    its rows invariant; the defaults (config_for) are the measured choice.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, inner = x.shape
    cols = weight.shape[0]
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    chosen_n, chosen_splits = config_for(cols, inner)
    block_n = block_n or chosen_n
    splits = num_splits or chosen_splits
    k_per_split = triton.cdiv(triton.cdiv(inner, splits), BLOCK_K) * BLOCK_K
    splits = triton.cdiv(inner, k_per_split)  # no empty range
    part = out if splits == 1 else x.new_empty((splits, rows, cols), dtype=torch.float32)
    grid = (triton.cdiv(rows, BLOCK_M), triton.cdiv(cols, block_n), splits)
    _matmul_kernel[grid](
        x, weight, part, rows, cols, inner, k_per_split, x.stride(0), weight.stride(0),
        cols, rows * cols,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K, DOT=dot_mode(x.dtype),
    )  # fmt: skip
    if splits > 1:
        numel = rows * cols
        _sum_splits_kernel[(triton.cdiv(numel, 1024),)](part, out, numel, splits, BLOCK=1024)
    return out
