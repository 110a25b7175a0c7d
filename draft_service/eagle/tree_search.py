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
request's whole committed context plus the scratch columns of its own ancestors and itself,
carried along with the frontier (a bitmask of columns for torch's masks; for the paged kernel
the path of their slots, root to leaf, one level's slot added per step); every other key is
masked.
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
    # What each node sees of the tree above it, its strict ancestors: a mask of their scratch
    # columns [B, k, S * k] (torch backend) or their scratch slots root to leaf [B, k, S]
    # (paged backend, whose kernel reads a node's path of slots).
    seen: torch.Tensor


def _top(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable descending top-k over a short last dim (ties keep the lower index)."""
    values, indices = scores.sort(dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def search_tree(head: EagleHead, kv: KVPools, inputs: SearchInputs, shape: TreeShape) -> Candidates:
    """Runs ``num_steps - 1`` head steps; returns all candidates (not yet reranked)."""
    k, num_req = shape.topk, inputs.root_features.shape[0]
    scores, tokens = head.draft_distribution(inputs.root_features, k)
    device = tokens.device
    seen_shape = (num_req, k, max(1, shape.num_steps - 1))  # paged: one slot a level
    if not inputs.paged:
        seen_shape = (num_req, k, inputs.scratch_slots.shape[1])
    frontier = _Frontier(
        tokens=tokens,
        scores=scores,
        features=inputs.root_features[:, None, :].expand(-1, k, -1),
        index=torch.arange(k, device=device).expand(num_req, k),
        seen=torch.zeros(seen_shape, dtype=torch.long if inputs.paged else torch.bool,
                         device=device),
    )  # fmt: skip
    levels = _Levels.of(inputs, k, shape.num_steps)
    found_tokens, found_scores, found_parents = [tokens], [scores], []
    num_found = k
    for step in range(1, shape.num_steps):
        features, seen = _run_frontier(head, kv, inputs, frontier, step, levels)
        child_p, child_tokens = head.draft_distribution(features, k)  # [B, k, k]
        child_scores = (frontier.scores[..., None] * child_p).flatten(1)
        found_tokens.append(child_tokens.flatten(1))
        found_scores.append(child_scores)
        found_parents.append(frontier.index[..., None].expand(-1, -1, k))  # a view: no copy
        if step + 1 < shape.num_steps:
            frontier = _next_frontier(
                child_tokens.flatten(1), child_scores, features, seen, num_found, k
            )
        num_found += k * k
    parents = [torch.full_like(tokens, -1)]
    if found_parents:  # one copy for every level's parents, read through their views
        parents.append(torch.cat(found_parents, dim=1).flatten(1))
    return Candidates(
        torch.cat(found_tokens, dim=1), torch.cat(found_scores, dim=1), torch.cat(parents, dim=1)
    )


@dataclass
class _Levels:
    """Per node (B * k of a level), what every level of a search reads, built once: its
    request's context length and table row, its position and key count at each level, and
    each level's write slots; contiguous, as the paged kernel wants them."""

    context: torch.Tensor  # [B * k]
    rows: torch.Tensor | None  # [B * k] table rows (paged)
    offsets: torch.Tensor  # [S + 1, B * k]: context + s (a level-s node's position is row s - 1)
    write_slots: torch.Tensor  # [S, B * k]: scratch slots a level's nodes write

    @staticmethod
    def of(inputs: SearchInputs, k: int, num_steps: int) -> _Levels:
        num_req = inputs.context_lens.shape[0]
        context = inputs.context_lens[:, None].expand(num_req, k).reshape(-1).contiguous()
        rows = None
        if inputs.table_rows is not None:
            rows = inputs.table_rows[:, None].expand(num_req, k).reshape(-1).contiguous()
        levels = torch.arange(num_steps, device=context.device)
        steps = num_steps - 1
        scratch = inputs.scratch_slots.view(num_req, steps, k).transpose(0, 1)
        return _Levels(
            context, rows, context[None, :] + levels[:, None],
            scratch.reshape(steps, num_req * k).contiguous(),
        )  # fmt: skip


def _run_frontier(
    head: EagleHead,
    kv: KVPools,
    inputs: SearchInputs,
    frontier: _Frontier,
    step: int,
    levels: _Levels,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One head step over the frontier of every request: features [B, k, H], and what each
    node saw of the tree (its ancestors and itself)."""
    num_req, k = frontier.tokens.shape
    write_slots = levels.write_slots[step - 1]
    meta: PagedMetadata | AttentionMetadata
    if inputs.paged:
        seen = frontier.seen  # a fresh tensor (zeros, or the last level's gather): written in place
        seen[:, :, step - 1] = write_slots.view(num_req, k)  # each node's own slot ends its path
        meta = paged_tree_metadata(inputs, write_slots, seen, levels, step)
    else:
        columns = torch.arange(k, device=write_slots.device) + (step - 1) * k
        width = frontier.seen.shape[2]
        itself = torch.arange(width, device=columns.device)[None, :] == columns[:, None]
        seen = frontier.seen | itself  # each node sees itself (no host value: capturable)
        meta = tree_metadata(inputs, write_slots, seen)
    positions = levels.offsets[step - 1]
    out = head(frontier.tokens.flatten(), frontier.features.flatten(0, 1), positions, kv, meta)
    return out.view(num_req, k, -1), seen


def _next_frontier(
    tokens: torch.Tensor,
    scores: torch.Tensor,
    features: torch.Tensor,
    seen: torch.Tensor,
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
        seen=seen.gather(1, parent[..., None].expand(-1, -1, seen.shape[2])),
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
    inputs: SearchInputs,
    write_slots: torch.Tensor,
    paths: torch.Tensor,
    levels: _Levels,
    step: int,
) -> PagedMetadata:
    """The same keys for the paged backend: the context from the request's table row, then the
    ``step`` scratch slots of the node's path (its ancestors and itself), root to leaf."""
    num_req, k, depth = paths.shape
    assert inputs.table is not None and levels.rows is not None
    return PagedMetadata(
        write_slots=write_slots,
        table=inputs.table,
        query_row=levels.rows,
        query_len=levels.offsets[step],
        prefix_len=levels.context,
        path=paths.view(num_req * k, depth),
        max_keys=inputs.table.shape[1] + depth,  # fixed: the grid must not follow the contexts
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
