"""Sampling from logits a request changes first: penalties, logit_bias, vLLM's rules
(target_service/penalties.py) and structured output's masks (token_masks.py).

The eager step and the decode graphs' LOGITS mode (graph_runner.py) both end here: the
graph leaves a decode step's raw logits in a static buffer, and the changes, the draw, the
logprobs and the completion counts follow in a handful of launches, where the whole eager
step costs hundreds (2026-12-04 21:39, H200, benchmarks/bench_structured.py: constrained
target-only decoding took 20.8 ms a token through the stack, eagerly, free decoding 1.3 ms).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model_runtime.sampling import sample
from target_service import penalties, token_masks
from target_service.logprob_pass import TokenLogprobs, logits_pass, read_back, widest
from target_service.logprobs import asked_tops
from target_service.request_table import RequestState
from target_service.sampling_tensors import sampling_tensors


def changes_logits(states: Sequence[RequestState], masks: Sequence[bytes]) -> bool:
    """Whether a step's logits change before sampling (then no sampling graph runs it)."""
    return token_masks.any_masked(masks) or any(penalties.has_penalty(s) for s in states)


def sample_changed(
    raw: torch.Tensor,
    sampled: list[RequestState],
    positions: torch.Tensor,
    masks: Sequence[bytes],
) -> tuple[list[int], list[TokenLogprobs | None] | None]:
    """Next ids of the sampled requests from their raw logits ``[R, V]`` (penalised, and masked
    where ``masks`` has one), drawn at ``positions`` (the new tokens'); the logprobs of those
    that asked, from the raw logits; their completion counts recorded."""
    logits = token_masks.restrict(penalties.penalize(raw, sampled), masks)
    ids = sample(logits, sampling_tensors(sampled, positions, raw.device))
    tops = asked_tops(sampled)
    packed = logits_pass(raw, ids, widest(tops)) if tops is not None else None
    next_ids = ids.tolist()  # the step's one device->host sync
    penalties.record(sampled, [[t] for t in next_ids], logits.shape[-1], raw.device)
    return next_ids, read_back(packed, tops, [1] * len(sampled))
