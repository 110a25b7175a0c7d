"""Plain-torch tree ops of tree speculative decoding: the reference for kernels/tree_kernels.py.

A batch holds B draft trees, each padded to N nodes:

- ``tokens[b, i]``: the token of node i. Node 0 is the root: the last committed token, whose KV is
  written in the same verify pass as the draft nodes.
- ``parents[b, i]``: ``-1`` for the root; for ``i > 0`` an index in ``[0, i)``, so every parent
  precedes its children (topological order).
- ``valid[b, i]``: real nodes. Padding nodes have parent 0, are never accepted, and no real node
  descends from one.

Siblings normally carry distinct tokens; when two share a token only the lowest index can ever be
accepted. Every function here is vectorised over the batch, runs on any device and never syncs
with the host, so it may sit inside a captured verify step. ``tree_mask_and_positions``,
``greedy_accept_path`` and ``compact_accepted`` have Triton twins of the same signature in
kernels/tree_kernels.py; kernels/tree_ops.py picks one per device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


class TreeLayout(NamedTuple):
    """Ancestry of every node, as the verify forward pass needs it.

    ``ancestors[b, i, j]`` (bool, [B, N, N]) is True iff j is i or an ancestor of i: row i is the
    attention mask of node i over the tree block (the committed prefix is visible to all).
    ``depths[b, i]`` (long, [B, N]) is the root distance, so node i sits at position
    ``prefix_len + depths[b, i]``. Padding nodes see only themselves and have depth 0.
    """

    ancestors: Tensor
    depths: Tensor


class Acceptance(NamedTuple):
    """Outcome of verifying one batch of trees.

    ``path[b, :num_accepted[b] + 1]`` are the node indices of the accepted chain, root first
    (``path[b, 0] == 0``, ``path[b, j]`` has depth j); the rest is ``-1``. ``num_accepted[b]``
    counts accepted draft nodes (the root excluded). ``next_token[b]`` is the token the target
    emits after the last path node: a correction when a child was rejected there, a bonus
    otherwise. The request commits the path tokens after the root, then ``next_token``.
    """

    path: Tensor
    num_accepted: Tensor
    next_token: Tensor


class TreeMask(NamedTuple):
    """What the verify forward pass needs of a tree batch, from one call.

    ``ancestors`` and ``depths`` as in TreeLayout; ``positions[b, i] = start_pos[b] +
    depths[b, i]`` (long, [B, N]), the rotary position of node i.
    """

    ancestors: Tensor
    depths: Tensor
    positions: Tensor

    def layout(self) -> TreeLayout:
        return TreeLayout(ancestors=self.ancestors, depths=self.depths)


def tree_mask_and_positions(parents: Tensor, valid: Tensor, start_pos: Tensor) -> TreeMask:
    """Ancestor masks, depths and positions of ``parents`` ([B, N]); ``start_pos`` is [B]."""
    layout = tree_attention_mask(parents, valid)
    positions = start_pos.to(torch.long).unsqueeze(1) + layout.depths
    return TreeMask(ancestors=layout.ancestors, depths=layout.depths, positions=positions)


def greedy_accept_path(
    tokens: Tensor, parents: Tensor, valid: Tensor, target_next: Tensor
) -> Acceptance:
    """``greedy_accept`` with the layout built inside (the Triton twin's signature)."""
    return greedy_accept(tokens, parents, valid, target_next)


def tree_attention_mask(parents: Tensor, valid: Tensor) -> TreeLayout:
    """Ancestor masks and depths of ``parents`` ([B, N], see the module docstring)."""
    num_nodes = parents.shape[1]
    node_ids = torch.arange(num_nodes, device=parents.device)
    has_parent = valid & (node_ids > 0)
    eye = torch.eye(num_nodes, dtype=torch.bool, device=parents.device)
    reach = ((parents.unsqueeze(-1) == node_ids) & has_parent.unsqueeze(-1)) | eye
    # Squaring the reachability relation doubles the path length it covers; ceil(log2(N - 1))
    # rounds reach the deepest possible chain. 0/1 products summed over <= N terms are exact in
    # float32 (and in TF32), so thresholding at 0.5 is safe.
    for _ in range(max(num_nodes - 2, 0).bit_length()):
        as_float = reach.float()
        reach = torch.bmm(as_float, as_float) > 0.5
    depths = reach.sum(dim=-1) - 1
    return TreeLayout(ancestors=reach, depths=depths)


def greedy_accept(
    tokens: Tensor,
    parents: Tensor,
    valid: Tensor,
    target_next: Tensor,
    layout: TreeLayout | None = None,
) -> Acceptance:
    """Longest chain whose every token equals the target's argmax after its parent.

    ``target_next[b, i]`` is the target's argmax after node i. From the root, the walk moves to
    the lowest-index child whose token equals ``target_next`` at the current node and stops when
    none does; ``next_token`` is ``target_next`` at the stop node. Pass ``layout`` when the caller
    already built it for the forward pass.
    """
    layout = layout if layout is not None else tree_attention_mask(parents, valid)
    parent_next = target_next.gather(1, parents.clamp(min=0))
    matches = (tokens == parent_next) & draft_nodes(valid)
    path, num_accepted = accepted_path(first_among_siblings(matches, parents), layout)
    next_token = target_next.gather(1, last_on_path(path, num_accepted)).squeeze(1)
    return Acceptance(path=path, num_accepted=num_accepted, next_token=next_token)


def accepted_path(chosen: Tensor, layout: TreeLayout) -> tuple[Tensor, Tensor]:
    """``(path, num_accepted)`` of the walk that follows ``chosen`` children from the root.

    ``chosen[b, i]`` says whether the walk, once at i's parent, moves on to i; at most one child
    per parent may be chosen and the root is never chosen (it is always on the path). A node is on
    the path iff it and all its non-root ancestors are chosen.
    """
    num_nodes = chosen.shape[1]
    chosen_or_root = chosen.clone()
    chosen_or_root[:, 0] = True
    on_path = ~(layout.ancestors & ~chosen_or_root.unsqueeze(1)).any(dim=-1)
    num_accepted = on_path.sum(dim=-1) - 1
    # The path is a chain, so depth orders it; nodes off the path go to a scratch column N.
    column = torch.where(on_path, layout.depths, num_nodes)
    node_ids = torch.arange(num_nodes, device=chosen.device).expand_as(column)
    path = torch.full((chosen.shape[0], num_nodes + 1), -1, dtype=torch.long, device=chosen.device)
    path.scatter_(1, column, node_ids)
    return path[:, :num_nodes], num_accepted


def last_on_path(path: Tensor, num_accepted: Tensor) -> Tensor:
    """``[B, 1]`` index of the deepest accepted node (the root when nothing was accepted)."""
    return path.gather(1, num_accepted.unsqueeze(1))


def compact_accepted(
    pools: Sequence[Tensor], node_slots: Tensor, path: Tensor, dummy_slot: int
) -> None:
    """Move the rows of the accepted path to the committed slots, in place.

    Each pool is indexed by slot along dim 0 (per-layer KV pools, the hidden-state pool).
    ``node_slots[b, i]`` is where node i's rows were written during verify; the j-th path node's
    rows end in ``node_slots[b, j]``, the slot of position ``prefix_len + j``. All sources are read
    before any destination is written, so overlapping moves are safe. Padded path entries read and
    write only ``dummy_slot``. The root (j = 0) is already in place and is not moved.
    """
    src, dst = accepted_moves(node_slots, path, dummy_slot)
    for pool in pools:
        pool.index_copy_(0, dst, pool.index_select(0, src))


def accepted_moves(node_slots: Tensor, path: Tensor, dummy_slot: int) -> tuple[Tensor, Tensor]:
    """compact_accepted's moves as flat (source, destination) slot vectors."""
    moved = path[:, 1:] >= 0
    src = torch.where(moved, node_slots.gather(1, path[:, 1:].clamp(min=0)), dummy_slot)
    dst = torch.where(moved, node_slots[:, 1:], dummy_slot)
    return src.flatten(), dst.flatten()


def sibling_before(parents: Tensor) -> Tensor:
    """``[B, N, N]`` bool: j < i and j shares i's parent (the root has no siblings)."""
    num_nodes = parents.shape[1]
    earlier = torch.ones(num_nodes, num_nodes, dtype=torch.bool, device=parents.device).tril(-1)
    return (parents.unsqueeze(2) == parents.unsqueeze(1)) & earlier


def draft_nodes(valid: Tensor) -> Tensor:
    """Nodes that may be accepted: valid and not the root."""
    draft = valid.clone()
    draft[:, 0] = False
    return draft


def first_among_siblings(candidates: Tensor, parents: Tensor) -> Tensor:
    """Keep a candidate only if no lower-index sibling is a candidate too."""
    blocked = (sibling_before(parents) & candidates.unsqueeze(1)).any(dim=-1)
    return candidates & ~blocked
