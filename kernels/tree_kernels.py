"""Triton twins of kernels/tree_reference.py: tree mask + positions, greedy acceptance, compaction.

Each function takes and returns what its reference does and equals it bit for bit on well-formed
trees (the layout of kernels/tree_reference.py). None reads a shape or a value back to the host,
and each is one kernel launch over fixed grids, so all three may sit inside a captured CUDA graph
once each shape has run eagerly (the first call compiles; compaction also builds its pool table
then, see kernels/tree_compact.py). Outputs may be passed in (``out=``) so a graph can own them.

On a machine without CUDA they run under Triton's interpreter (``TRITON_INTERPRET=1`` set before
this module is imported), which is how CI tests them; kernels/tree_ops.py only picks them on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.tree_compact import compact_accepted, on_device, warps_for
from kernels.tree_reference import Acceptance, TreeMask

__all__ = [
    "INTERPRETED",
    "compact_accepted",
    "greedy_accept_path",
    "tree_mask_and_positions",
    "warps_for",
]

# The ancestor kernel holds a [rows, BLOCK_N] tile in registers; this caps its size.
MASK_TILE = 4096


@triton.jit
def _tree_mask_kernel(
    parents_ptr,
    valid_ptr,
    start_ptr,
    anc_ptr,
    depth_ptr,
    pos_ptr,
    num_nodes,
    BLOCK_I: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Every row i walks up its parent chain at once; the walk marks each node it visits.
    batch = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < num_nodes
    tree = batch * num_nodes
    cur = rows
    anc = (cur[:, None] == cols[None, :]) & row_ok[:, None]
    active = row_ok
    steps = tl.program_id(0) * 0
    # A well-formed walk ends within depth + 1 rounds; num_nodes rounds bound any input.
    while (tl.max(active.to(tl.int32), axis=0) > 0) & (steps < num_nodes):
        can_step = active & (cur > 0)
        node_valid = tl.load(valid_ptr + tree + cur, mask=can_step, other=0)
        parent = tl.load(parents_ptr + tree + cur, mask=can_step, other=-1)
        # The reference draws an edge i -> parent only for valid non-root i with parent in range.
        active = can_step & (node_valid != 0) & (parent >= 0) & (parent < num_nodes)
        cur = tl.where(active, parent.to(tl.int32), cur)
        anc = anc | (active[:, None] & (cur[:, None] == cols[None, :]))
        steps += 1
    depth = tl.sum(anc.to(tl.int64), axis=1) - 1
    start = tl.load(start_ptr + batch).to(tl.int64)
    out_rows = tree + rows
    tile = out_rows[:, None] * num_nodes + cols[None, :]
    tl.store(anc_ptr + tile, anc.to(tl.uint8), mask=row_ok[:, None] & (cols[None, :] < num_nodes))
    tl.store(depth_ptr + out_rows, depth, mask=row_ok)
    tl.store(pos_ptr + out_rows, start + depth, mask=row_ok)


# True when TRITON_INTERPRET=1 was set before this module was imported (the kernels then run on
# host copies of their arguments: for CPU tests only).
INTERPRETED = type(_tree_mask_kernel).__name__ == "InterpretedFunction"


def tree_mask_and_positions(
    parents: Tensor, valid: Tensor, start_pos: Tensor, out: TreeMask | None = None
) -> TreeMask:
    """Triton ``kernels.tree_reference.tree_mask_and_positions``: ancestors bool [B, N, N],
    depths and positions long [B, N]. ``out`` (same shapes and dtypes, contiguous) is filled."""
    num_req, num_nodes = parents.shape
    if out is None:
        out = TreeMask(
            ancestors=parents.new_empty((num_req, num_nodes, num_nodes), dtype=torch.bool),
            depths=parents.new_empty((num_req, num_nodes), dtype=torch.long),
            positions=parents.new_empty((num_req, num_nodes), dtype=torch.long),
        )
    if num_req * num_nodes == 0:
        return out
    block_n = triton.next_power_of_2(num_nodes)
    block_i = max(1, min(block_n, MASK_TILE // block_n))
    grid = (num_req, triton.cdiv(num_nodes, block_i))
    with on_device(parents):
        _tree_mask_kernel[grid](
            parents.contiguous(),
            _bytes(valid),
            start_pos.contiguous(),
            out.ancestors.view(torch.uint8),
            out.depths,
            out.positions,
            num_nodes,
            BLOCK_I=block_i,
            BLOCK_N=block_n,
            num_warps=warps_for(block_i * block_n),
        )
    return out


@triton.jit
def _greedy_path_kernel(
    tokens_ptr,
    parents_ptr,
    valid_ptr,
    next_ptr,
    path_ptr,
    accepted_ptr,
    bonus_ptr,
    num_nodes,
    BLOCK_N: tl.constexpr,
):
    # One program per tree: the whole tree sits in registers; each round moves one level down.
    batch = tl.program_id(0).to(tl.int64)
    tree = batch * num_nodes
    cols = tl.arange(0, BLOCK_N)
    in_tree = cols < num_nodes
    tokens = tl.load(tokens_ptr + tree + cols, mask=in_tree, other=0)
    parents = tl.load(parents_ptr + tree + cols, mask=in_tree, other=-1)
    valid = tl.load(valid_ptr + tree + cols, mask=in_tree, other=0)
    draft = in_tree & (valid != 0) & (cols > 0)
    path = tl.where(cols == 0, 0, -1).to(tl.int64)
    cur = tl.program_id(0) * 0  # the root
    depth = cur
    moved = depth == 0
    while moved:
        wanted = tl.load(next_ptr + tree + cur)
        matches = draft & (parents == cur) & (tokens == wanted)
        child = tl.min(tl.where(matches, cols, BLOCK_N), axis=0)
        moved = (child < BLOCK_N) & (depth < num_nodes - 1)  # the bound only binds on cycles
        depth += moved.to(tl.int32)
        path = tl.where(moved & (cols == depth), child.to(tl.int64), path)
        cur = tl.where(moved, child, cur)
    tl.store(path_ptr + tree + cols, path, mask=in_tree)
    tl.store(accepted_ptr + batch, depth.to(tl.int64))
    tl.store(bonus_ptr + batch, tl.load(next_ptr + tree + cur))


def greedy_accept_path(
    tokens: Tensor,
    parents: Tensor,
    valid: Tensor,
    target_next: Tensor,
    out: Acceptance | None = None,
) -> Acceptance:
    """Triton ``kernels.tree_reference.greedy_accept_path``: path long [B, N] (-1 padded),
    num_accepted long [B], next_token [B] of target_next's dtype. ``out`` is filled if given."""
    num_req, num_nodes = tokens.shape
    if out is None:
        out = Acceptance(
            path=tokens.new_empty((num_req, num_nodes), dtype=torch.long),
            num_accepted=tokens.new_empty((num_req,), dtype=torch.long),
            next_token=target_next.new_empty((num_req,)),
        )
    if num_req * num_nodes == 0:
        return out
    with on_device(tokens):
        _greedy_path_kernel[(num_req,)](
            tokens.contiguous(),
            parents.contiguous(),
            _bytes(valid),
            target_next.contiguous(),
            out.path,
            out.num_accepted,
            out.next_token,
            num_nodes,
            BLOCK_N=triton.next_power_of_2(num_nodes),
            num_warps=warps_for(num_nodes),
        )
    return out


def _bytes(mask: Tensor) -> Tensor:
    """A bool tensor as uint8 (same bytes, no copy), which every Triton version loads."""
    mask = mask.contiguous()
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask
