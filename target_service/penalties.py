"""Presence and frequency penalties and logit_bias, as OpenAI defines them, applied exactly
under speculation.

OpenAI: ``logits[t] -= frequency_penalty * c[t] + presence_penalty * (c[t] > 0)``, where
``c[t]`` counts token t in the completion so far (the prompt does not count). The target keeps
``c`` per request (it samples every completion token: a Forward's sampled token, a Verify's
accepted drafts and bonus). At a verified tree node the completion so far is the committed
completion plus the drafts on the node's path (the root is already committed), so each node's
logits are penalised with exactly the counts sequential decoding would have there, before the
target picks its token there (argmax or keyed draw): output with speculation equals output
without.
``logit_bias`` is added to every position's logits alike, sampled or verified.

HF/vLLM's ``repetition_penalty`` p: ``logit / p if logit > 0 else logit * p`` for every token
seen in the prompt or the completion so far. The router sends the context it has when it opens
the request (``repetition_context``: the prompt, or prompt + completion after a re-prefill), the
target adds what it samples; a tree node sees that set plus the drafts on its path.

vLLM's ``min_tokens``: while fewer than ``min_tokens`` tokens were sampled, the banned ids (the
router's EOS ids and stop_token_ids) get -inf. A tree node at depth d predicts the token d
after the committed completion, so it is banned while ``num_sampled + d < min_tokens``.

Order, as vLLM's sampler: logit_bias, the min_tokens ban, repetition, presence/frequency.
No CUDA graph applies any of this itself (min_tokens matters only while its ban binds): a
decode step with any of it replays the decode graphs' LOGITS mode and is changed and drawn
after the replay (changed_logits.py); multi-step decoding and the verify graphs step aside
(the eager verify).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from target_service.request_table import RequestState


def has_penalty(state: RequestState) -> bool:
    """Whether the request's logits are changed before sampling (then no graph runs them)."""
    s = state.sampling
    return has_counts(state) or bool(s.logit_bias) or has_repetition(state) or bans_now(state)


def has_repetition(state: RequestState) -> bool:
    return state.sampling.repetition_penalty != 1.0


def bans_now(state: RequestState) -> bool:
    """Whether min_tokens still refuses its ids at the next sampled position."""
    s = state.sampling
    return state.num_sampled < s.min_tokens and bool(s.min_tokens_banned_ids)


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


def _banned(states: Sequence[RequestState], vocab: int, like: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` bool: the ids min_tokens refuses now, per request (none where it does not)."""
    rows: list[int] = []
    cols: list[int] = []
    for row, s in enumerate(states):
        if bans_now(s):
            rows += [row] * len(s.sampling.min_tokens_banned_ids)
            cols += s.sampling.min_tokens_banned_ids
    mask = torch.zeros((len(states), vocab), dtype=torch.bool, device=like.device)
    mask[torch.tensor(rows, device=like.device), torch.tensor(cols, device=like.device)] = True
    return mask


def _owed(states: Sequence[RequestState], like: torch.Tensor) -> torch.Tensor:
    """``[R]`` tokens still to sample before the ban lifts (0 where nothing is banned)."""
    owed = [s.sampling.min_tokens - s.num_sampled if bans_now(s) else 0 for s in states]
    return torch.tensor(owed, dtype=torch.int64, device=like.device)


def _seen_row(state: RequestState, vocab: int, device: torch.device) -> torch.Tensor:
    if state.seen is None:
        state.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        context = state.sampling.repetition_context
        if context:
            state.seen[torch.tensor(context, device=device)] = True
    return state.seen


def _seen(states: Sequence[RequestState], vocab: int, like: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` bool: tokens in each request's context (none without repetition_penalty)."""
    rows = [
        _seen_row(s, vocab, like.device)
        if has_repetition(s)
        else torch.zeros(vocab, dtype=torch.bool, device=like.device)
        for s in states
    ]
    return torch.stack(rows)


def _repeat(
    logits: torch.Tensor, seen: torch.Tensor, states: Sequence[RequestState]
) -> torch.Tensor:
    """HF's RepetitionPenaltyLogitsProcessor on the seen tokens; ``seen`` broadcasts."""
    values = [s.sampling.repetition_penalty for s in states]
    penalty = torch.tensor(values, dtype=logits.dtype, device=logits.device)
    penalty = penalty.view(-1, *([1] * (logits.dim() - 1)))
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def penalize(logits: torch.Tensor, states: Sequence[RequestState]) -> torch.Tensor:
    """Logits ``[R, V]`` of the next token of each request, penalised by its context."""
    vocab = logits.shape[-1]
    if any(s.sampling.logit_bias for s in states):
        logits = logits + _biases(states, vocab, logits)
    if any(bans_now(s) for s in states):
        logits = logits.masked_fill(_banned(states, vocab, logits), float("-inf"))
    if any(has_repetition(s) for s in states):
        logits = _repeat(logits, _seen(states, vocab, logits), states)
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
    vocab = logits.shape[-1]
    if any(s.sampling.logit_bias for s in states):
        logits = logits + _biases(states, vocab, logits)[:, None, :]
    if any(bans_now(s) for s in states):
        depths = ancestors.sum(-1) - 1  # the root is its own only ancestor: depth 0
        active = depths < _owed(states, logits)[:, None]  # [B, N]
        banned = active[:, :, None] & _banned(states, vocab, logits)[:, None, :]
        logits = logits.masked_fill(banned, float("-inf"))
    repetition = any(has_repetition(s) for s in states)
    if not (repetition or any(has_counts(s) for s in states)):
        return logits
    on_path = _on_path(logits, tokens, valid, ancestors)  # [B, N, V]
    if repetition:
        seen = _seen(states, vocab, logits)[:, None, :] | (on_path > 0)
        logits = _repeat(logits, seen, states)
    if not any(has_counts(s) for s in states):
        return logits
    counts = _counts(states, vocab, logits)[:, None, :] + on_path
    presence, frequency = _weights(states, logits)
    return (
        logits
        - frequency[:, None, None] * counts
        - presence[:, None, None] * (counts > 0).to(logits.dtype)
    )


def _on_path(
    logits: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, ancestors: torch.Tensor
) -> torch.Tensor:
    """``[B, N, V]``: how often each token is drafted on the path from the root to each node."""
    drafted = valid.clone()
    drafted[:, 0] = False  # the root is the last committed token: counted already
    one_hot = torch.zeros_like(logits)
    one_hot.scatter_(-1, torch.where(valid, tokens, 0).unsqueeze(-1), 1.0)
    one_hot = one_hot * drafted.unsqueeze(-1).to(logits.dtype)
    return torch.bmm(ancestors.to(logits.dtype), one_hot)


def record(
    states: Sequence[RequestState],
    committed: Sequence[Sequence[int]],
    vocab: int,
    device: torch.device,
) -> None:
    """Adds each request's newly sampled tokens to its completion counts, its seen tokens and
    its number sampled."""
    for state, token_ids in zip(states, committed, strict=True):
        state.num_sampled += len(token_ids)
        if has_repetition(state) and token_ids:
            ids = torch.tensor(list(token_ids), dtype=torch.int64, device=device)
            _seen_row(state, vocab, device)[ids] = True
        if not has_counts(state) or not token_ids:
            continue
        if state.counts is None:
            state.counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        ids = torch.tensor(list(token_ids), dtype=torch.int64, device=device)
        state.counts.index_add_(0, ids, torch.ones(len(ids), device=device))
