"""Greedy token ids: the argmax of each row of logits, in two short Triton passes.

torch's argmax over one 128k-wide row (a Llama-3 vocabulary) ran as a single-block reduction,
28 us of an 8B decode step's 4.8 ms on the H200 (benchmarks/gpu_profile.py), after a cast of
the logits to fp32 that the argmax does not need: the cast is exact and keeps the order. Here
each row is cut into blocks of BLOCK columns, one program per (row, block) finds its block's
maximum and first index of it, and one program per row picks the first block holding the row's
maximum. The result is torch.argmax's (the first index of the maximum) for every row of finite
values; a NaN counts as +inf here (torch returns the first NaN). Nothing syncs with the host,
so it sits inside captured graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 4096  # columns per first-pass program: 32 programs for a 128k row, 12 for SmolLM2's

_NO_INDEX = 2**62  # larger than any column: the min over "not a maximum" lanes


@triton.jit(do_not_specialize=["num_cols"])
def _block_max_kernel(x_ptr, max_ptr, idx_ptr, stride_x, num_cols, num_blocks,
                      BLOCK: tl.constexpr, NO_INDEX: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    live = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=float("-inf")).to(tl.float32)
    x = tl.where(x != x, float("inf"), x)  # NaN: counted as +inf
    top = tl.max(x, 0)
    first = tl.min(tl.where(live & (x == top), cols.to(tl.int64), NO_INDEX), 0)
    tl.store(max_ptr + row * num_blocks + block, top)
    tl.store(idx_ptr + row * num_blocks + block, first)


@triton.jit
def _row_pick_kernel(max_ptr, idx_ptr, out_ptr, num_blocks, BLOCKS: tl.constexpr,
                     NO_INDEX: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, BLOCKS)
    live = b < num_blocks
    tops = tl.load(max_ptr + row * num_blocks + b, mask=live, other=float("-inf"))
    firsts = tl.load(idx_ptr + row * num_blocks + b, mask=live, other=NO_INDEX)
    top = tl.max(tops, 0)
    # Blocks hold increasing columns, so the least index among the maximal blocks is the first.
    tl.store(out_ptr + row, tl.min(tl.where(live & (tops == top), firsts, NO_INDEX), 0))


def argmax_rows(x: Tensor, out: Tensor | None = None) -> Tensor:
    """x: [R, V] (last dim contiguous, any float dtype); returns int64 [R], into ``out`` if
    given (contiguous)."""
    num_rows, num_cols = x.shape
    if x.stride(-1) != 1:
        raise ValueError("argmax_rows: the rows of x must be contiguous")
    out = torch.empty(num_rows, dtype=torch.long, device=x.device) if out is None else out
    if num_rows == 0:
        return out
    num_blocks = triton.cdiv(num_cols, BLOCK)
    block_max = torch.empty((num_rows, num_blocks), dtype=torch.float32, device=x.device)
    block_idx = torch.empty((num_rows, num_blocks), dtype=torch.long, device=x.device)
    _block_max_kernel[(num_rows, num_blocks)](
        x, block_max, block_idx, x.stride(0), num_cols, num_blocks, BLOCK=BLOCK,
        NO_INDEX=_NO_INDEX,
    )  # fmt: skip
    _row_pick_kernel[(num_rows,)](
        block_max, block_idx, out, num_blocks, BLOCKS=triton.next_power_of_2(num_blocks),
        NO_INDEX=_NO_INDEX,
    )  # fmt: skip
    return out
