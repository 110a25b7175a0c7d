"""The draft's k most likely tokens and their probabilities, softmax and top-k in two Triton passes.

torch's softmax followed by topk(k) over the 16,384-token hot vocabulary ran as a softmax kernel
and a radix-select topk (gatherTopK, about 50 us a call on the H200 for 8 rows) at every level
of the draft search: a third of the draft round's device time
(benchmarks/results/gpu_draft_profile_2026-12-02.json). Here each row is cut into blocks of
BLOCK columns; one program per (row, block) finds its block's maximum, its sum of
exp(x - maximum) and its k largest logits by k rounds of "take the maximum"; one program per row
merges the blocks' sums and picks the row's k largest among the blocks' candidates. Ordering by
logit is ordering by probability, so no probability is formed except for the k chosen.

Ties keep the lower column first (torch's topk leaves their order unspecified). Values are
sorted descending. Rows must hold finite logits and k <= columns. Nothing syncs with the host,
so it sits inside captured graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 2048  # columns per first-pass program: 8 for the 16,384-token hot vocabulary
MAX_K = 64
_NO_INDEX = 2**62  # larger than any column: the min over lanes that are not the maximum


@triton.jit(do_not_specialize=["num_cols"])
def _block_topk_kernel(x_ptr, stride_x, num_cols, num_blocks, max_ptr, sum_ptr, val_ptr, idx_ptr,
                       K: tl.constexpr, BLOCK: tl.constexpr, NO_INDEX: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    live = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=live, other=float("-inf")).to(tl.float32)
    top = tl.max(x, 0)
    tl.store(max_ptr + row * num_blocks + block, top)
    tl.store(sum_ptr + row * num_blocks + block, tl.sum(tl.where(live, tl.exp(x - top), 0.0), 0))
    out = (row * num_blocks + block) * K
    free = live
    for j in tl.static_range(K):
        best = tl.max(tl.where(free, x, float("-inf")), 0)
        first = tl.min(tl.where(free & (x == best), cols.to(tl.int64), NO_INDEX), 0)
        tl.store(val_ptr + out + j, best)
        tl.store(idx_ptr + out + j, first)
        free = free & (cols.to(tl.int64) != first)


@triton.jit
def _row_merge_kernel(max_ptr, sum_ptr, val_ptr, idx_ptr, prob_ptr, out_idx_ptr, num_blocks,
                      K: tl.constexpr, BLOCKS: tl.constexpr, CANDS: tl.constexpr,
                      NO_INDEX: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    b = tl.arange(0, BLOCKS)
    live_b = b < num_blocks
    maxes = tl.load(max_ptr + row * num_blocks + b, mask=live_b, other=float("-inf"))
    sums = tl.load(sum_ptr + row * num_blocks + b, mask=live_b, other=0.0)
    top = tl.max(maxes, 0)
    total = tl.sum(tl.where(live_b, sums * tl.exp(maxes - top), 0.0), 0)
    c = tl.arange(0, CANDS)
    live = c < num_blocks * K
    vals = tl.load(val_ptr + row * num_blocks * K + c, mask=live, other=float("-inf"))
    idxs = tl.load(idx_ptr + row * num_blocks * K + c, mask=live, other=NO_INDEX)
    free = live & (idxs < NO_INDEX)
    for j in tl.static_range(K):
        best = tl.max(tl.where(free, vals, float("-inf")), 0)
        first = tl.min(tl.where(free & (vals == best), idxs, NO_INDEX), 0)
        tl.store(prob_ptr + row * K + j, tl.exp(best - top) / total)
        tl.store(out_idx_ptr + row * K + j, first)
        free = free & (idxs != first)


def softmax_topk(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """logits [..., V] (last dim contiguous, any float dtype) -> (probabilities fp32 [..., k],
    column ids int64 [..., k]): the k most likely columns of softmax(logits) per row, sorted
    descending, ties lower column first."""
    num_cols = logits.shape[-1]
    if not 1 <= k <= min(num_cols, MAX_K):
        raise ValueError(f"softmax_topk: k={k} must be in 1..min(columns={num_cols}, {MAX_K})")
    lead = logits.shape[:-1]
    x = logits.reshape(-1, num_cols)
    if x.stride(-1) != 1:
        raise ValueError("softmax_topk: the rows of logits must be contiguous")
    num_rows, device = x.shape[0], x.device
    probs = torch.empty((num_rows, k), dtype=torch.float32, device=device)
    index = torch.empty((num_rows, k), dtype=torch.long, device=device)
    if num_rows:
        _launch(x, k, probs, index)
    return probs.view(*lead, k), index.view(*lead, k)


def _launch(x: Tensor, k: int, probs: Tensor, index: Tensor) -> None:
    (num_rows, num_cols), device = x.shape, x.device
    num_blocks = triton.cdiv(num_cols, BLOCK)
    block_max = torch.empty((num_rows, num_blocks), dtype=torch.float32, device=device)
    block_sum = torch.empty_like(block_max)
    cand_val = torch.empty((num_rows, num_blocks * k), dtype=torch.float32, device=device)
    cand_idx = torch.empty((num_rows, num_blocks * k), dtype=torch.long, device=device)
    _block_topk_kernel[(num_rows, num_blocks)](
        x, x.stride(0), num_cols, num_blocks, block_max, block_sum, cand_val, cand_idx,
        K=k, BLOCK=BLOCK, NO_INDEX=_NO_INDEX,
    )  # fmt: skip
    _row_merge_kernel[(num_rows,)](
        block_max, block_sum, cand_val, cand_idx, probs, index, num_blocks, K=k,
        BLOCKS=triton.next_power_of_2(num_blocks),
        CANDS=triton.next_power_of_2(num_blocks * k), NO_INDEX=_NO_INDEX,
    )  # fmt: skip
