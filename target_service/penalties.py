"""Presence and frequency penalties and logit_bias, as OpenAI defines them, applied exactly
under speculation.

OpenAI: ``logits[t] -= frequency_penalty * c[t] + presence_penalty * (c[t] > 0)``, where
``c[t]`` counts token t in the completion so far (the prompt does not count). The target keeps
``c`` per request (it samples every completion token: a Forward's sampled token, a Verify's
accepted drafts and bonus). At a verified tree node the completion so far is the committed
completion plus the drafts on the node's path (the root is already committed), so each node's
logits are penalised with exactly the counts sequential decoding would have there, before
greedy acceptance or rejection sampling: output with speculation equals output without.
``logit_bias`` is added to every position's logits alike, sampled or verified.

The CUDA graphs (decode, multi-step, verify) apply none of this: a request with any of it
takes the eager step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from target_service.request_table import RequestState


def has_penalty(state: RequestState) -> bool:
    """Whether the request's logits are changed before sampling (then no graph runs them)."""
    return has_counts(state) or bool(state.sampling.logit_bias)


def has_counts(state: RequestState) -> bool:
    s = state.sampling
    return s.presence_penalty != 0 or s.frequency_penalty != 0


def _biases(states: Sequence[RequestState], vocab: int, like: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` logit_bias rows (zeros for requests without)."""
    rows = []
    for s in states:
        if s.bias is None and s.sampling.logit_bias:
            ids, values = zip(*s.sampling.logit_bias, strict=True)
            s.bias = torch.zeros(vocab, dtype=torch.float32, device=like.device)
            s.bias[torch.tensor(ids, device=like.device)] = torch.tensor(values, device=like.device)
        rows.append(s.bias if s.bias is not None else like.new_zeros(vocab, dtype=torch.float32))
    return torch.stack(rows).to(like.dtype)


def _counts(states: Sequence[RequestState], vocab: int, like: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` completion counts (zeros for requests without penalties)."""
    rows = [s.counts if s.counts is not None else like.new_zeros(vocab) for s in states]
    return torch.stack(rows).to(like.dtype)


def _weights(states: Sequence[RequestState], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    values = [[s.sampling.presence_penalty, s.sampling.frequency_penalty] for s in states]
    table = torch.tensor(values, dtype=like.dtype, device=like.device)
    return table[:, 0], table[:, 1]


def penalize(logits: torch.Tensor, states: Sequence[RequestState]) -> torch.Tensor:
    """Logits ``[R, V]`` of the next token of each request, penalised by its completion."""
    if any(s.sampling.logit_bias for s in states):
        logits = logits + _biases(states, logits.shape[-1], logits)
    if not any(has_counts(s) for s in states):
        return logits
    counts = _counts(states, logits.shape[-1], logits)
    presence, frequency = _weights(states, logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (counts > 0).to(logits.dtype)


def penalize_tree(
    logits: torch.Tensor,
    states: Sequence[RequestState],
    tokens: torch.Tensor,
    valid: torch.Tensor,
    ancestors: torch.Tensor,
) -> torch.Tensor:
    """Logits ``[B, N, V]`` after each tree node, penalised by the committed completion plus
    the draft tokens on the node's path (``ancestors[b, i, j]``: j is i or above it)."""
    if any(s.sampling.logit_bias for s in states):
        logits = logits + _biases(states, logits.shape[-1], logits)[:, None, :]
    if not any(has_counts(s) for s in states):
        return logits
    num_req, num_nodes, vocab = logits.shape
    drafted = valid.clone()
    drafted[:, 0] = False  # the root is the last committed token: counted already
    one_hot = torch.zeros_like(logits)
    one_hot.scatter_(-1, torch.where(valid, tokens, 0).unsqueeze(-1), 1.0)
    one_hot = one_hot * drafted.unsqueeze(-1).to(logits.dtype)
    on_path = torch.bmm(ancestors.to(logits.dtype), one_hot)  # [B, N, V]
    counts = _counts(states, vocab, logits)[:, None, :] + on_path
    presence, frequency = _weights(states, logits)
    return (
        logits
        - frequency[:, None, None] * counts
        - presence[:, None, None] * (counts > 0).to(logits.dtype)
    )


def record(
    states: Sequence[RequestState],
    committed: Sequence[Sequence[int]],
    vocab: int,
    device: torch.device,
) -> None:
    """Adds each request's newly sampled tokens to its completion counts."""
    for state, token_ids in zip(states, committed, strict=True):
        if not has_counts(state) or not token_ids:
            continue
        if state.counts is None:
            state.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        ids = torch.tensor(list(token_ids), dtype=torch.int64, device=device)
        state.counts.index_add_(0, ids, torch.ones(len(ids), device=device))
