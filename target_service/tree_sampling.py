"""Lossless tree verification for sampled decoding, with deterministic (one-hot) draft proposals.

The algorithm, per request: stand at the root with residual ``r = q`` (the target distribution
after the current node). Visit the children in index order; accept child c with probability
``r(tok_c) / sum(r)``; on rejection set ``r(tok_c) = 0`` and try the next child. If a child is
accepted, move to it with a fresh ``r = q_child`` and repeat. When every child is rejected, emit a
correction token drawn from ``r / sum(r)``; at a leaf (no children) emit a bonus token drawn from
``q`` there — the same rule, as nothing was zeroed. Each accept/reject is the recursive rejection
step of multi-draft speculative sampling with a point-mass proposal, so the emitted tokens are
distributed exactly as sequential sampling from the target.

The sibling scan needs no loop: once the scan reaches sibling c every earlier sibling was
rejected, so the residual there is ``q`` minus the distinct earlier sibling tokens, and the
accepted child is the lowest-index sibling whose own coin passes its own threshold.
"""

from __future__ import annotations

import torch
from torch import Tensor

from target_service.tree import (
    Acceptance,
    TreeLayout,
    accepted_path,
    draft_nodes,
    first_among_siblings,
    last_on_path,
    sibling_before,
    tree_attention_mask,
)


def tree_rejection_sample(
    tokens: Tensor,
    parents: Tensor,
    valid: Tensor,
    target_probs: Tensor,
    uniforms: Tensor,
    layout: TreeLayout | None = None,
) -> Acceptance:
    """Verify a batch of draft trees by rejection sampling against the target.

    ``target_probs[b, i]`` ([B, N, V]) is the target's distribution after node i, already shaped
    by temperature/top-k/top-p; rows need not be normalised, only non-negative with positive
    mass. ``uniforms`` ([B, N + 1], in [0, 1)) are independent coins: ``uniforms[b, i]`` decides
    node i, ``uniforms[b, N]`` draws ``next_token``. A draft token with zero target probability is
    never accepted, and neither is a sibling repeating an earlier sibling's token.
    """
    layout = layout if layout is not None else tree_attention_mask(parents, valid)
    # float64 coins stay float64: rounding 1 - 2**-53 to 1.0 would reject a sure acceptance.
    dtype = torch.promote_types(target_probs.dtype, uniforms.dtype)
    dtype = torch.promote_types(dtype, torch.float32)
    draft = draft_nodes(valid)
    # Padding tokens may be anything (even -1); they are only ever used as indices.
    safe_tokens = torch.where(valid, tokens, 0)
    passes = _passing_children(safe_tokens, parents, draft, target_probs, uniforms[:, :-1], dtype)
    path, num_accepted = accepted_path(first_among_siblings(passes, parents), layout)
    last = last_on_path(path, num_accepted)
    residual = _residual_at(target_probs, last, parents, safe_tokens, draft, dtype)
    next_token = _inverse_cdf(residual, uniforms[:, -1])
    return Acceptance(path=path, num_accepted=num_accepted, next_token=next_token)


def _passing_children(
    tokens: Tensor,
    parents: Tensor,
    draft: Tensor,
    target_probs: Tensor,
    coins: Tensor,
    dtype: torch.dtype,
) -> Tensor:
    """``[B, N]``: node i would be accepted if the scan over its siblings reached it.

    Reaching i means every lower-index sibling was rejected, so i is accepted with probability
    ``fresh(i) / (total - sum of fresh(j) over earlier siblings j)`` under its parent's ``q``.
    """
    parent_ids = parents.clamp(min=0)
    batch_ids = torch.arange(tokens.shape[0], device=tokens.device).unsqueeze(1)
    token_mass = target_probs[batch_ids, parent_ids, tokens].to(dtype)
    fresh_mass = _first_occurrence_mass(token_mass, tokens, parents, draft)
    earlier = _earlier_draft_siblings(parents, draft).to(dtype)
    removed = torch.bmm(earlier, fresh_mass.unsqueeze(-1)).squeeze(-1)
    remaining = target_probs.sum(dim=-1, dtype=dtype).gather(1, parent_ids) - removed
    # u < fresh / remaining without the division; fresh_mass > 0 keeps a zero-probability token
    # rejected even when rounding drives `remaining` to <= 0.
    return draft & (fresh_mass > 0) & (coins.to(dtype) * remaining < fresh_mass)


def _earlier_draft_siblings(parents: Tensor, draft: Tensor) -> Tensor:
    """``[B, N, N]``: j is a real, lower-index sibling of i."""
    return sibling_before(parents) & draft.unsqueeze(1)


def _first_occurrence_mass(
    token_mass: Tensor, tokens: Tensor, parents: Tensor, draft: Tensor
) -> Tensor:
    """Target mass of each draft token, zero where an earlier sibling already used the token.

    This is both the acceptance numerator and the mass a rejection removes from the residual: a
    repeated token was zeroed by the first rejection, so it can neither be accepted nor removed
    twice.
    """
    same_token = tokens.unsqueeze(2) == tokens.unsqueeze(1)
    repeated = (_earlier_draft_siblings(parents, draft) & same_token).any(dim=-1)
    return torch.where(draft & ~repeated, token_mass, 0.0)


def _residual_at(
    target_probs: Tensor,
    last: Tensor,
    parents: Tensor,
    tokens: Tensor,
    draft: Tensor,
    dtype: torch.dtype,
) -> Tensor:
    """``[B, V]`` target distribution after the last path node, its children's tokens zeroed.

    Every real child of the last node was rejected (or there is none), so all of them leave the
    residual. If rounding rejected a child that held all the remaining mass, nothing is left; the
    unmodified distribution is used then, an event of probability on the order of the float
    epsilon.
    """
    batch_ids = torch.arange(last.shape[0], device=last.device)
    probs_at_last = target_probs[batch_ids, last.squeeze(1)].to(dtype)
    num_tokens = probs_at_last.shape[1]
    padded = probs_at_last.new_zeros(last.shape[0], num_tokens + 1)
    padded[:, :num_tokens] = probs_at_last
    # Rejected children zero their token, every other node zeroes the scratch column: all writes
    # store the same 0, so repeated indices cannot race (and plain scatter_ is deterministic).
    rejected = (parents == last) & draft
    padded.scatter_(1, torch.where(rejected, tokens, num_tokens), 0.0)
    residual = padded[:, :num_tokens]
    has_mass = residual.sum(dim=-1, keepdim=True) > 0
    return torch.where(has_mass, residual, probs_at_last.to(dtype))


def _inverse_cdf(weights: Tensor, coins: Tensor) -> Tensor:
    """``[B]`` token drawn from the unnormalised ``weights`` ([B, V]) with ``coins`` in [0, 1).

    Returns the first index whose cumulative weight exceeds ``coin * total``, so tokens of zero
    weight are never drawn.
    """
    cdf = weights.cumsum(dim=-1)
    threshold = coins.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    index = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    # A coin below 1 keeps the threshold below the total, but a low-precision generator can round
    # a coin up to 1.0; argmax (first maximum of the non-decreasing cdf) is then the last token
    # with weight, the limit of the draw as the coin approaches 1.
    return torch.minimum(index, cdf.argmax(dim=-1))
