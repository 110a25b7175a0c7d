"""Validation, padding and packing of draft trees before a verify pass.

A step's trees arrive as host lists (``HostTrees``). ``pack_trees`` lays them out, padded to
B trees of N nodes, as one flat list of ints that one host->device copy moves: tokens,
parents and valid (0/1), each [B, N] row-major, then rows and start_pos, each [B]. Padding
nodes are invalid children of the root (token 0, parent 0); padded trees are all padding, on
slot-table row 0 at position 0. All zeros is therefore all padding. The verify graphs
(verify_graphs.py) copy it into their static buffer; ``pad_trees`` builds the eager path's
``TreeBatch`` from it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from target_service.errors import InvalidStep
from target_service.verify import TreeBatch


class HostTrees(NamedTuple):
    """A verify step's trees as the host has them: unpadded lists, one entry per tree."""

    token_ids: list[list[int]]
    parents: list[list[int]]  # -1 for the root, then each < its index (check_tree)
    rows: list[int]  # slot-table rows
    start_pos: list[int]  # position of each root

    @property
    def shape(self) -> tuple[int, int]:
        """(number of trees, nodes of the largest)."""
        return len(self.token_ids), max(len(t) for t in self.token_ids)


class PackedTrees(NamedTuple):
    """Views of one ``pack_trees`` block of B trees of N nodes (long throughout)."""

    tokens: torch.Tensor  # [B, N]
    parents: torch.Tensor  # [B, N]
    valid: torch.Tensor  # [B, N]: 1 for real nodes, 0 for padding
    rows: torch.Tensor  # [B]
    start_pos: torch.Tensor  # [B]


def check_tree(request_id: str, token_ids: list[int], parents: list[int], vocab_size: int) -> None:
    if not token_ids:
        raise InvalidStep(f"request {request_id!r}: a tree needs at least its root")
    if len(parents) != len(token_ids):
        raise InvalidStep(
            f"request {request_id!r}: {len(token_ids)} tokens but {len(parents)} parents"
        )
    if parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise InvalidStep(
            f"request {request_id!r}: parent_indices must be -1 then each < its index"
        )
    if any(not 0 <= t < vocab_size for t in token_ids):
        raise InvalidStep(f"request {request_id!r}: tree token outside [0, {vocab_size})")


def tree_depth(parents: list[int]) -> int:
    """Edges on the longest root path: a bound on the drafts verify can accept."""
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return max(depths)


def packed_len(batch: int, nodes: int) -> int:
    return batch * (3 * nodes + 2)


def pack_trees(trees: HostTrees, batch: int, nodes: int) -> list[int]:
    """The trees padded to ``batch`` x ``nodes``, flat (the layout in the module docstring)."""
    num_trees = len(trees.token_ids)
    padded_trees = [0] * ((batch - num_trees) * nodes)
    flat: list[int] = []
    for field in (trees.token_ids, trees.parents, [[1] * len(t) for t in trees.token_ids]):
        for values in field:
            flat += values
            flat += [0] * (nodes - len(values))
        flat += padded_trees
    padded_rows = [0] * (batch - num_trees)
    return flat + trees.rows + padded_rows + trees.start_pos + padded_rows


def unpack(flat: torch.Tensor, batch: int, nodes: int) -> PackedTrees:
    """Views of the ``pack_trees`` block at the start of ``flat``."""
    block = batch * nodes
    sizes = [block, block, block, batch, batch]
    tokens, parents, valid, rows, start_pos = flat[: packed_len(batch, nodes)].split(sizes)
    shape = (batch, nodes)
    return PackedTrees(tokens.view(shape), parents.view(shape), valid.view(shape), rows, start_pos)


def pad_trees(trees: HostTrees, device: torch.device) -> TreeBatch:
    """The eager path's batch: every tree padded to the largest, moved with one copy."""
    num_trees, num_nodes = trees.shape
    flat = pack_trees(trees, num_trees, num_nodes) + [len(t) for t in trees.token_ids]
    host = torch.from_numpy(np.array(flat, dtype=np.int64))
    on_device = host.to(device, non_blocking=True)
    packed = unpack(on_device, num_trees, num_nodes)
    return TreeBatch(
        packed.tokens,
        packed.parents,
        packed.valid != 0,
        packed.rows,
        packed.start_pos,
        on_device[-num_trees:],
        all_full=all(len(t) == num_nodes for t in trees.token_ids),
    )
