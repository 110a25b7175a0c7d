"""EAGLE-2 dynamic tree search for a batch of requests: device tensors only, no host syncs.

Per request: level 1 is the top-k of the root distribution. Each further step runs the head
once on the k frontier nodes of every request and scores each node's top-k children by joint
probability (product of draft probabilities along the path); the k best children across the
whole level form the next frontier. After ``num_steps - 1`` head steps all candidates are
reranked by score and the best ``num_draft_tokens - 1`` are kept. A child's score never exceeds
its parent's, and ties keep the earlier (generation-order) candidate first, so a parent always
outranks its children and the kept set is a connected tree. Children of one node come from one
top-k, so siblings are distinct.

Tree attention: the frontier at step s runs at position L + s - 1 (L = context pairs) and
writes its K/V into scratch column (s - 1) * k + j of its request. Each query sees the
request's whole committed context plus the scratch columns of its own ancestors and itself
(an ancestry bitmask carried along with the frontier); every other key is masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draft_service.drafter import TreeShape
from draft_service.eagle.head import EagleHead, KVPools
from model_runtime.attention import AttentionMetadata
from model_runtime.paged import PagedMetadata


@dataclass
class SearchInputs:
    """Device tensors for one batched search (B requests, S = num_steps - 1, k = topk).

    The context slots come either as a dense block (torch's masks) or, for the paged backend,
    as rows of the drafter's request table read in place, so that no shape depends on the
    context lengths (the fixed-shape search of search_graphs.py)."""

    root_features: torch.Tensor  # [B, H] head output at each request's last context pair
    context_lens: torch.Tensor  # [B] context pairs L per request (>= 1; 0 for a padded row)
    scratch_slots: torch.Tensor  # [B, S * k] KV slots for the expanded tree nodes
    context_slots: torch.Tensor | None = None  # [B, Lmax] slot of each pair; dummy-padded
    table: torch.Tensor | None = None  # paged: [R, W] the request table's slots
    table_rows: torch.Tensor | None = None  # paged: [B] each request's row of it

    @property
    def paged(self) -> bool:
        return self.table is not None


@dataclass
class Candidates:
    """Every drafted node of a search in generation order: [B, C], C = k + S * k * k."""

    tokens: torch.Tensor
    scores: torch.Tensor  # joint draft probability of the path from the root
    parents: torch.Tensor  # candidate index of the parent; -1 for children of the root


@dataclass
class _Frontier:
    tokens: torch.Tensor  # [B, k] nodes the next head step runs
    scores: torch.Tensor  # [B, k]
    features: torch.Tensor  # [B, k, H] head input: the feature that predicted each node
    index: torch.Tensor  # [B, k] candidate index of each node
    ancestry: torch.Tensor  # [B, k, S * k] scratch columns of each node's strict ancestors


def _top(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable descending top-k over a short last dim (ties keep the lower index)."""
    values, indices = scores.sort(dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def search_tree(head: EagleHead, kv: KVPools, inputs: SearchInputs, shape: TreeShape) -> Candidates:
    """Runs ``num_steps - 1`` head steps; returns all candidates (not yet reranked)."""
    k, num_req = shape.topk, inputs.root_features.shape[0]
    scores, tokens = head.draft_distribution(inputs.root_features, k)
    device = tokens.device
    frontier = _Frontier(
        tokens=tokens,
        scores=scores,
        features=inputs.root_features[:, None, :].expand(-1, k, -1),
        index=torch.arange(k, device=device).expand(num_req, k),
        ancestry=torch.zeros(
            (num_req, k, inputs.scratch_slots.shape[1]), dtype=torch.bool, device=device
        ),
    )
    found = [(tokens, scores, torch.full_like(tokens, -1))]
    num_found = k
    for step in range(1, shape.num_steps):
        features, allowed_tree = _run_frontier(head, kv, inputs, frontier, step)
        child_p, child_tokens = head.draft_distribution(features, k)  # [B, k, k]
        child_scores = (frontier.scores[..., None] * child_p).flatten(1)
        child_parents = frontier.index[..., None].expand(-1, -1, k).flatten(1)
        found.append((child_tokens.flatten(1), child_scores, child_parents))
        if step + 1 < shape.num_steps:
            frontier = _next_frontier(
                child_tokens.flatten(1), child_scores, features, allowed_tree, num_found, k
            )
        num_found += k * k
    tokens, scores, parents = (torch.cat(parts, dim=1) for parts in zip(*found, strict=True))
    return Candidates(tokens, scores, parents)


def _run_frontier(
    head: EagleHead, kv: KVPools, inputs: SearchInputs, frontier: _Frontier, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One head step over the frontier of every request: features [B, k, H] and its mask."""
    num_req, k = frontier.tokens.shape
    rows = torch.arange(k, device=frontier.tokens.device)
    columns = rows + (step - 1) * k
    width = frontier.ancestry.shape[2]
    itself = torch.arange(width, device=rows.device)[None, :] == columns[:, None]  # [k, S * k]
    allowed_tree = frontier.ancestry | itself  # each node sees itself (no host value: capturable)
    write_slots = inputs.scratch_slots[:, columns].flatten()
    build = paged_tree_metadata if inputs.paged else tree_metadata
    meta = build(inputs, write_slots, allowed_tree)
    positions = (inputs.context_lens + step - 1)[:, None].expand(-1, k).flatten()
    out = head(frontier.tokens.flatten(), frontier.features.flatten(0, 1), positions, kv, meta)
    return out.view(num_req, k, -1), allowed_tree


def _next_frontier(
    tokens: torch.Tensor,
    scores: torch.Tensor,
    features: torch.Tensor,
    allowed_tree: torch.Tensor,
    offset: int,
    k: int,
) -> _Frontier:
    """The k best of this level's k * k children (tokens/scores [B, k*k]) across parents."""
    best_scores, best = _top(scores, k)
    parent = best // k  # frontier row that produced each chosen child
    hidden = features.shape[-1]
    return _Frontier(
        tokens=tokens.gather(1, best),
        scores=best_scores,
        features=features.gather(1, parent[..., None].expand(-1, -1, hidden)),
        index=best + offset,
        ancestry=allowed_tree.gather(1, parent[..., None].expand(-1, -1, allowed_tree.shape[2])),
    )


def tree_metadata(
    inputs: SearchInputs, write_slots: torch.Tensor, allowed_tree: torch.Tensor
) -> AttentionMetadata:
    """Keys per request: [context slots | scratch slots]; no query padding (k per request)."""
    num_req, k, _ = allowed_tree.shape
    device = write_slots.device
    assert inputs.context_slots is not None
    max_len = inputs.context_slots.shape[1]
    in_context = torch.arange(max_len, device=device) < inputs.context_lens[:, None]  # [B, Lmax]
    allowed = torch.cat([in_context[:, None, :].expand(-1, k, -1), allowed_tree], dim=2)
    rows = torch.arange(num_req * k, device=device)
    return AttentionMetadata(
        write_slots=write_slots,
        query_index=rows.view(num_req, k),
        key_slots=torch.cat([inputs.context_slots, inputs.scratch_slots], dim=1),
        allowed=allowed[:, None],
        token_rows=rows,
    )


def paged_tree_metadata(
    inputs: SearchInputs, write_slots: torch.Tensor, allowed_tree: torch.Tensor
) -> PagedMetadata:
    """The same keys for the paged backend: the context from the request's table row, then the
    scratch slots the node sees (its ancestors and itself) in column order, root to leaf."""
    num_req, k, width = allowed_tree.shape
    device = write_slots.device
    columns = torch.arange(width, device=device)
    order = torch.argsort((~allowed_tree).long() * width + columns, dim=-1)
    path = inputs.scratch_slots[:, None, :].expand(num_req, k, width).gather(2, order)
    prefix = inputs.context_lens[:, None].expand(num_req, k).reshape(-1).contiguous()
    table, table_rows = inputs.table, inputs.table_rows
    assert table is not None and table_rows is not None
    rows = table_rows[:, None].expand(num_req, k)
    return PagedMetadata(
        write_slots=write_slots.contiguous(),
        table=table,
        query_row=rows.reshape(-1).contiguous(),
        query_len=prefix + allowed_tree.sum(-1).reshape(-1),
        prefix_len=prefix,
        path=path.reshape(num_req * k, width).contiguous(),
        max_keys=table.shape[1] + width,  # fixed: the grid must not follow the contexts
        tile_tokens=k,  # a request's k nodes of a level share its context
    )


def rerank(
    candidates: Candidates, num_keep: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best ``num_keep`` candidates in topological order: tokens, parents, scores [B, m].

    Parents index the output tree, whose node 0 is the root (so kept node i is tree node i + 1).
    """
    num_req, num_cand = candidates.scores.shape
    num_keep = min(num_keep, num_cand)
    _, keep = _top(candidates.scores, num_keep)
    keep = keep.sort(dim=1).values  # generation order is topological
    device = keep.device
    tree_index = torch.full((num_req, num_cand), -1, dtype=torch.long, device=device)
    tree_index.scatter_(1, keep, torch.arange(1, num_keep + 1, device=device).expand(num_req, -1))
    cand_parent = candidates.parents.gather(1, keep)
    parents = torch.where(cand_parent < 0, 0, tree_index.gather(1, cand_parent.clamp(min=0)))
    return candidates.tokens.gather(1, keep), parents, candidates.scores.gather(1, keep)
