"""Validation and padding of draft trees before a verify pass."""

from __future__ import annotations

import torch

from target_service.errors import InvalidStep
from target_service.verify import TreeBatch


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


def pad_trees(
    token_ids: list[list[int]],
    parents: list[list[int]],
    rows: list[int],
    start_pos: list[int],
    device: torch.device,
) -> TreeBatch:
    """Pads every tree to the largest; padding nodes are invalid children of the root."""
    num_nodes = max(len(t) for t in token_ids)
    tokens = torch.zeros((len(token_ids), num_nodes), dtype=torch.int64)
    parent = torch.zeros((len(token_ids), num_nodes), dtype=torch.int64)
    valid = torch.zeros((len(token_ids), num_nodes), dtype=torch.bool)
    for b, (toks, pars) in enumerate(zip(token_ids, parents, strict=True)):
        tokens[b, : len(toks)] = torch.tensor(toks)
        parent[b, : len(pars)] = torch.tensor(pars)
        valid[b, : len(toks)] = True
    sizes = torch.tensor([len(t) for t in token_ids])
    to = {"device": device, "non_blocking": True}
    return TreeBatch(
        tokens.to(**to),
        parent.to(**to),
        valid.to(**to),
        torch.tensor(rows).to(**to),
        torch.tensor(start_pos).to(**to),
        sizes.to(**to),
        all_full=all(len(t) == num_nodes for t in token_ids),
    )
