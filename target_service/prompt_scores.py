"""Prompt log-probabilities (ForwardItem.scored_ids): each scored token's log-probability under
the hidden row of the position before it, computed in the eager step that runs its chunk.

A prefill samples from its last row only; scoring needs the distribution at every row whose
successor was asked for, so this pass runs the head over those rows, in blocks of
``SCORE_BLOCK`` (one block's fp32 logits and log-softmax over SmolLM2's 49,152 tokens are
2 x 48 MiB, whatever the chunk's length). Like the other logprob passes (logprobs.py) it is
launched before the step's one device->host sync and read after it; steps without scored ids
pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model_runtime.llama import LlamaForCausalLM
from target_service.admission import StepItem
from target_service.device_batch import on_device
from target_service.logprob_pass import TokenLogprobs, Tops, answer_from_rows, logits_pass, widest
from target_service.request_table import RequestState

SCORE_BLOCK = 256


@dataclass
class ScorePlan:
    rows: torch.Tensor  # [M] on the device: the step's token index of each scoring row
    tokens: torch.Tensor  # [M] on the device: the token scored under that row
    lengths: list[int]  # per item: how many it scores (0: none)
    tops: Tops  # per item: its request's top_logprobs; None where it scores nothing


def plan_scores(
    items: list[StepItem], states: list[RequestState], device: torch.device
) -> ScorePlan | None:
    """The step's scoring rows (item i's scored_ids[j] under its token j); None when no item
    scores (then no pass at all)."""
    if not any(item.scored_ids for item in items):  # a decode step's case: nothing built
        return None
    rows: list[int] = []
    tokens: list[int] = []
    offset = 0
    for item in items:
        rows += range(offset, offset + len(item.scored_ids))
        tokens += item.scored_ids
        offset += len(item.token_ids)
    lengths = [len(it.scored_ids) for it in items]
    tops = [s.sampling.top_logprobs if n else None for s, n in zip(states, lengths, strict=True)]
    on_rows, on_tokens = on_device(device, rows, tokens)
    return ScorePlan(on_rows, on_tokens, lengths, tops)


def score_pass(model: LlamaForCausalLM, hidden: torch.Tensor, plan: ScorePlan) -> torch.Tensor:
    """[M, 1 + 2 * top] on the device, no sync (``logits_pass``'s rows), block by block."""
    top = widest(plan.tops)
    blocks = zip(plan.rows.split(SCORE_BLOCK), plan.tokens.split(SCORE_BLOCK), strict=True)
    return torch.cat([logits_pass(model.logits(hidden[r]), t, top) for r, t in blocks])


def read_scores(
    packed: torch.Tensor | None, plan: ScorePlan | None
) -> list[TokenLogprobs | None] | None:
    """After the step's sync: one answer per item (None for one that scored nothing)."""
    if packed is None or plan is None:
        return None
    host = packed.tolist()
    answers: list[TokenLogprobs | None] = []
    start = 0
    for n, top in zip(plan.lengths, plan.tops, strict=True):
        answers.append(None if top is None else answer_from_rows(host[start : start + n], top))
        start += n
    return answers
