"""What a Forward and a Verify give back, in the engine's terms (the servicer encodes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from target_service.admission import VerifyItem
from target_service.logprob_pass import TokenLogprobs
from target_service.verify import VerifyOutput


@dataclass
class VerifyResult:
    token_ids: list[int]  # accepted drafts, then the bonus token
    num_accepted: int
    hidden: torch.Tensor | None  # [num_accepted + 1, H] on the host
    logprobs: TokenLogprobs | None = None  # over token_ids, when the request asked


@dataclass
class StepResult:
    next_token_ids: list[int]
    forward_ms: float  # the call's wall time in the engine
    device_ms: float = 0.0  # of it, the device's (model_runtime/device_clock.py)
    # None unless a request asked: then one per sampled item (None for one that did not ask)
    logprobs: list[TokenLogprobs | None] | None = None
    # None unless an item carried scored ids: then one per item (prompt_scores.py)
    scored: list[TokenLogprobs | None] | None = None


class VerifyStep(NamedTuple):
    results: list[VerifyResult]
    forward_ms: float
    device_ms: float


def verify_results(items: list[VerifyItem], out: VerifyOutput) -> list[VerifyResult]:
    """One result per tree: its committed ids, its hidden rows where it asked for them, its
    logprobs where its request asked for them."""
    answers = out.logprobs or [None] * len(items)
    return [
        VerifyResult(
            ids,
            n,
            out.hidden[b, : n + 1] if it.return_hidden and out.hidden is not None else None,
            answer,
        )
        for b, (it, ids, n, answer) in enumerate(
            zip(items, out.token_ids, out.num_accepted, answers, strict=True)
        )
    ]
