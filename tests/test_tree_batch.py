"""target_service/tree_batch.py: the packed layout of a verify step's trees (the one block a
host->device copy moves), its padding (invalid children of the root; padded trees all padding
on row 0 at position 0, so all zeros), the eager path's TreeBatch built from it, and the depth
bound on what a tree can accept."""

from __future__ import annotations

import torch

from target_service.tree_batch import (
    HostTrees,
    pack_trees,
    packed_len,
    pad_trees,
    tree_depth,
    unpack,
)

TREES = HostTrees(
    token_ids=[[7, 8, 9], [4, 5, 6, 11, 12]],
    parents=[[-1, 0, 1], [-1, 0, 0, 2, 3]],
    rows=[3, 1],
    start_pos=[10, 20],
)


def test_pack_pads_nodes_and_trees() -> None:
    flat = pack_trees(TREES, 4, 8)
    assert len(flat) == packed_len(4, 8)
    tokens, parents, valid, rows, start_pos = unpack(torch.tensor(flat), 4, 8)
    assert tokens.tolist() == [
        [7, 8, 9, 0, 0, 0, 0, 0],
        [4, 5, 6, 11, 12, 0, 0, 0],
        [0] * 8,
        [0] * 8,
    ]
    assert parents.tolist() == [
        [-1, 0, 1, 0, 0, 0, 0, 0],
        [-1, 0, 0, 2, 3, 0, 0, 0],
        [0] * 8,
        [0] * 8,
    ]
    assert valid.tolist() == [[1] * 3 + [0] * 5, [1] * 5 + [0] * 3, [0] * 8, [0] * 8]
    assert rows.tolist() == [3, 1, 0, 0]
    assert start_pos.tolist() == [10, 20, 0, 0]


def test_unpack_reads_the_front_of_a_larger_buffer() -> None:
    buffer = torch.full((packed_len(8, 16),), -7)
    buffer[: packed_len(2, 8)] = torch.tensor(pack_trees(TREES, 2, 8))
    packed = unpack(buffer, 2, 8)
    assert all(t.is_contiguous() for t in packed)
    assert packed.rows.tolist() == [3, 1]
    assert packed.tokens[1, :5].tolist() == [4, 5, 6, 11, 12]


def test_pad_trees_is_the_unbucketed_pack() -> None:
    batch = pad_trees(TREES, torch.device("cpu"))
    assert batch.tokens.tolist() == [[7, 8, 9, 0, 0], [4, 5, 6, 11, 12]]
    assert batch.parents.tolist() == [[-1, 0, 1, 0, 0], [-1, 0, 0, 2, 3]]
    assert batch.valid.dtype == torch.bool
    assert batch.valid.tolist() == [[True] * 3 + [False] * 2, [True] * 5]
    assert batch.rows.tolist() == [3, 1]
    assert batch.start_pos.tolist() == [10, 20]
    assert batch.num_nodes.tolist() == [3, 5]
    assert not batch.all_full
    assert pad_trees(HostTrees([[1, 2]], [[-1, 0]], [0], [4]), torch.device("cpu")).all_full


def test_tree_depth() -> None:
    assert tree_depth([-1]) == 0
    assert tree_depth([-1, 0, 0, 0]) == 1
    assert tree_depth([-1, 0, 1, 0, 3, 4]) == 3
