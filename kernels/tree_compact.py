"""Triton compaction of the accepted path's rows, all pools in one launch.

The pools (per-layer K and V, the hidden-state pool; any dtypes and row widths) are copied as raw
words, so the copy is bit-exact for every dtype. One launch covers every pool: a small table on
the device lists, per (pool, column chunk), the pool's word offset from the lowest-addressed pool,
its row width and its row count. The table is built on the first call for a set of pools and kept
(``pool_table``); that first call copies it to the device, so it must run outside a CUDA graph
capture, like the kernel's compilation (a warm-up step does both).

Each program moves one column chunk of one tree's path in one pool, PATH_ROUND path entries a
round: it loads the round's source rows, waits at a barrier, then stores the destinations, so
overlapping moves inside a round are safe; across rounds, a later round only reads rows of deeper
nodes (``path[j] >= j``), which no earlier round wrote, and its barrier keeps its stores after
every earlier read. The walk stops at the first -1 (the path is its accepted prefix, then -1, as
the reference's Acceptance says). Trees must not share slots, which holds for the router's slots
(one request per slot); padding entries are skipped, which leaves the pools as the reference's
dummy-slot self-copies do, so ``dummy_slot`` is only checked, never touched. Slots outside a pool
are skipped too instead of touching memory outside it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

# A program moves PATH_ROUND path entries a round (an accepted path is rarely longer than 8) of
# one column chunk; the [PATH_ROUND, chunk] tile of words is capped by COPY_TILE (registers).
PATH_ROUND = 8
COPY_TILE = 4096
WORD_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
TABLE_CACHE_SIZE = 8  # pool sets kept (weakly: a table never keeps a pool alive)


@dataclass(frozen=True)
class PoolTable:
    pools: tuple[weakref.ref, ...]  # the pools it was built for, to check a cache hit
    base_index: int  # which pool has the lowest address (offsets are counted from it)
    word: torch.dtype  # the unit of the copy
    entries: Tensor  # int64 [E, 4] on the pools' device: word offset, row words, first col, rows
    block_cols: int
    num_rows: int  # the fewest rows of any pool

    def built_for(self, pools: Sequence[Tensor]) -> bool:
        return len(pools) == len(self.pools) and all(
            ref() is pool for ref, pool in zip(self.pools, pools, strict=True)
        )

    def base(self, pools: Sequence[Tensor]) -> Tensor:
        return pools[self.base_index].reshape(-1).view(torch.uint8).view(self.word)


# Keyed by the pools' addresses; a hit must also be the same tensor objects (built_for), so a
# pool freed and another allocated at its address with another shape gets a new table.
_tables: OrderedDict[tuple[int, ...], PoolTable] = OrderedDict()


@triton.jit
def _compact_kernel(
    base_ptr,
    table_ptr,
    slots_ptr,
    path_ptr,
    num_nodes,
    BLOCK_J: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    entry = tl.program_id(0).to(tl.int64) * 4
    tree = tl.program_id(1).to(tl.int64) * num_nodes
    pool = base_ptr + tl.load(table_ptr + entry)
    row_words = tl.load(table_ptr + entry + 1)
    cols = tl.load(table_ptr + entry + 2) + tl.arange(0, BLOCK_C)
    num_rows = tl.load(table_ptr + entry + 3)
    col_ok = (cols < row_words)[None, :]
    # Path entry j (j >= 1) moves node path[j]'s row to node j's slot, BLOCK_J entries a round.
    first = tl.program_id(0) * 0 + 1
    going = first < num_nodes
    while going:
        steps = first + tl.arange(0, BLOCK_J)
        node = tl.load(path_ptr + tree + steps, mask=steps < num_nodes, other=-1)
        moved = (node >= 0) & (node < num_nodes)
        src = tl.load(slots_ptr + tree + node, mask=moved, other=0).to(tl.int64)
        dst = tl.load(slots_ptr + tree + steps, mask=moved, other=0).to(tl.int64)
        inside = (src >= 0) & (src < num_rows) & (dst >= 0) & (dst < num_rows)
        mask = (moved & inside & (src != dst))[:, None] & col_ok
        rows = tl.load(pool + src[:, None] * row_words + cols[None, :], mask=mask)
        tl.debug_barrier()  # every source of the round read before any destination is written
        tl.store(pool + dst[:, None] * row_words + cols[None, :], rows, mask=mask)
        # The path is its accepted prefix, then -1: a round that ends on -1 ends the walk.
        last = tl.sum(tl.where(steps == first + BLOCK_J - 1, moved, False).to(tl.int32), axis=0)
        first += BLOCK_J
        going = (last > 0) & (first < num_nodes)


def compact_accepted(
    pools: Sequence[Tensor], node_slots: Tensor, path: Tensor, dummy_slot: int
) -> None:
    """Triton ``kernels.tree_reference.compact_accepted``, in place, one launch for all pools.

    ``node_slots`` [B, N] (int32 or int64) and ``path`` [B, N] as in the reference. Pools must be
    contiguous, share a device and hold ``dummy_slot`` (a row no tree's path names).
    """
    num_req, num_nodes = path.shape
    if num_req == 0 or num_nodes < 2 or not pools:
        return
    table = pool_table(pools)
    if not 0 <= dummy_slot < table.num_rows:
        raise ValueError(f"dummy slot {dummy_slot} is outside a pool")
    if not table.entries.shape[0]:
        return  # every pool is empty
    grid = (table.entries.shape[0], num_req)
    with on_device(path):
        _compact_kernel[grid](
            table.base(pools),
            table.entries,
            node_slots.contiguous(),
            path.contiguous(),
            num_nodes,
            BLOCK_J=PATH_ROUND,
            BLOCK_C=table.block_cols,
            num_warps=warps_for(PATH_ROUND * table.block_cols),
        )


def pool_table(pools: Sequence[Tensor]) -> PoolTable:
    """The launch table of ``pools`` (built once per set of pools, then cached)."""
    key = tuple(pool.data_ptr() for pool in pools)
    found = _tables.get(key)
    if found is not None and found.built_for(pools):
        _tables.move_to_end(key)
        return found
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("compact_accepted: run it once on these pools before graph capture")
    table = _build_table(pools)
    _tables[key] = table
    while len(_tables) > TABLE_CACHE_SIZE:
        _tables.popitem(last=False)
    return table


def _build_table(pools: Sequence[Tensor]) -> PoolTable:
    device = pools[0].device
    for pool in pools:
        if pool.device != device or not pool.is_contiguous() or pool.dim() < 1:
            raise ValueError("compact_accepted: pools must be contiguous and on one device")
    filled = [i for i, pool in enumerate(pools) if pool.numel() > 0]
    base_index = min(filled, key=lambda i: pools[i].data_ptr(), default=0)
    base = pools[base_index].data_ptr()
    row_bytes = {i: pools[i][0].numel() * pools[i].element_size() for i in filled}
    gaps = {i: pools[i].data_ptr() - base for i in filled}
    word = next(
        w
        for w in WORD_DTYPES
        if all(n % w == 0 for n in [*row_bytes.values(), *gaps.values(), base])
    )
    widest = max(row_bytes.values(), default=word) // word
    block_cols = min(triton.next_power_of_2(widest), COPY_TILE // PATH_ROUND)
    entries = [
        [gaps[i] // word, row_bytes[i] // word, first_col, pools[i].shape[0]]
        for i in filled
        for first_col in range(0, row_bytes[i] // word, block_cols)
    ]
    return PoolTable(
        pools=tuple(weakref.ref(pool) for pool in pools),
        base_index=base_index,
        word=WORD_DTYPES[word],
        entries=torch.tensor(entries, dtype=torch.long, device=device).view(-1, 4),
        block_cols=block_cols,
        num_rows=min(pool.shape[0] for pool in pools),
    )


def warps_for(tile: int) -> int:
    """Warps per program for a tile of ``tile`` elements (8 halves the registers of a 4096
    tile, measured with ptxas for sm_90; small tiles need no more than 4)."""
    return 8 if tile >= 2048 else 4


def on_device(tensor: Tensor) -> contextlib.AbstractContextManager:
    """Launch on the tensor's GPU (Triton launches on the current device)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()
