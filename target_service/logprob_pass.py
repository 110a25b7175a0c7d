"""The log-probability pass's device side and its read-back: pure tensor work, no service
state (target_service/logprobs.py says where each route gets its rows)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tops = list[int | None]  # per request: None, or how many likeliest tokens it wants


@dataclass
class TokenLogprobs:
    token_logprobs: list[float]  # one per token
    top_ids: list[int]  # ``top`` per token, token-major, most likely first
    top_logprobs: list[float]


def widest(tops: Tops) -> int:
    return max(t for t in tops if t is not None)


def logits_pass(logits: torch.Tensor, tokens: torch.Tensor, top: int) -> torch.Tensor:
    """[M, 1 + 2 * top] on the device, no sync: per row of fp32 ``logits``, the
    log-probability of its token, then the ``top`` largest and their ids (as floats, so that
    one copy carries them all: exact in float32 below 2**24 ids, float64 past that)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens[:, None])
    if not top:
        return chosen
    values, ids = logprobs.topk(top, dim=-1)
    dtype = torch.float32 if logprobs.shape[-1] <= 2**24 else torch.float64
    return torch.cat([chosen.to(dtype), values.to(dtype), ids.to(dtype)], 1)


def committed_tokens(
    path_tokens: torch.Tensor, counts: torch.Tensor, next_token: torch.Tensor, rows: int
) -> torch.Tensor:
    """[B, rows] on the device: the token each of a verify's first ``rows`` path nodes chose:
    node j chose path token j + 1, and the last accepted node the next token (entries past a
    tree's accepted count are junk the caller drops)."""
    depth = torch.arange(rows, device=path_tokens.device)
    ahead = depth[None, :] < counts[:, None]
    shifted = torch.cat([path_tokens[:, 1:rows], next_token[:, None]], 1)  # [B, rows]
    return torch.where(ahead, shifted, next_token[:, None])


def read_back(
    packed: torch.Tensor | None, tops: Tops | None, lengths: list[int]
) -> list[TokenLogprobs | None] | None:
    """After the step's sync: each request's answer (``split_shares``), None when none asked."""
    if packed is None or tops is None:
        return None
    return split_shares(packed.tolist(), tops, lengths)


def split_shares(
    host: list[list[float]], tops: Tops, lengths: list[int]
) -> list[TokenLogprobs | None]:
    """A pass's rows, read back: an equal share per request, in order; a request's answer is
    the first ``lengths[i]`` rows of its share (None for one that did not ask)."""
    share = len(host) // len(tops)
    return [
        None if top is None else answer_from_rows(host[i * share : i * share + n], top)
        for i, (top, n) in enumerate(zip(tops, lengths, strict=True))
    ]


def answer_from_rows(rows: list[list[float]], top: int) -> TokenLogprobs:
    """One request's answer from its rows of a pass (a row per token)."""
    answer = TokenLogprobs([], [], [])
    for row in rows:
        width = (len(row) - 1) // 2  # the pass's top, at least this request's
        answer.token_logprobs.append(row[0])
        answer.top_logprobs += row[1 : 1 + top]
        answer.top_ids += [int(i) for i in row[1 + width : 1 + width + top]]
    return answer
