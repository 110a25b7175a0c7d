"""Prompt log-probabilities (SamplingParams.prompt_logprobs), gathered chunk by chunk.

Each prefill chunk of a request that asked carries the prompt tokens that follow its own
(router/forward_item.py); the target scores each under the row before it and answers in
ForwardResponse.scored. The router spells the answers out as the public LogprobEntry items
(router/logprobs.py), one per prompt position from 1 on, and sends them all on the request's
first stream item. A chunk computed again (after a retraction) adds nothing already held.
"""

from __future__ import annotations

import logging

from protos import generation_pb2 as pb
from protos import target_pb2
from router.logprobs import LogprobSpeller
from router.request import Request

log = logging.getLogger("splitspec.router")


def scored_ids(req: Request, start: int, num_tokens: int) -> list[int]:
    """What a chunk of positions [start, start + num_tokens) scores: the prompt tokens after
    each of its positions, while the request still misses some."""
    if not req.scores_missing:
        return []
    return req.prompt_ids[start + 1 : start + num_tokens + 1]


def record_scores(
    speller: LogprobSpeller, req: Request, start: int, answer: target_pb2.Logprobs
) -> None:
    """A chunk's answer, its first score at position ``start + 1``: the positions not held yet."""
    count = len(answer.token_logprobs)
    if not count or not req.scores_missing:
        return
    entries = speller.entries(answer, req.prompt_ids[start + 1 : start + 1 + count])
    held = len(req.prompt_scores)  # positions 1 .. held
    if start > held:
        log.warning("request %s: prompt scores from position %d, held to %d: dropped",
                    req.request_id, start + 1, held)  # fmt: skip
        return
    req.prompt_scores += entries[held - start :]


def attach_scores(item: pb.GenerateResponse, req: Request) -> None:
    """The request's first item carries its prompt's scores (all that the target sent)."""
    if req.scores_missing:
        log.warning("request %s: the target scored %d of %d prompt positions",
                    req.request_id, len(req.prompt_scores), req.prompt_len - 1)  # fmt: skip
    item.prompt_logprobs.extend(req.prompt_scores)
