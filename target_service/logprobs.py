"""Log-probabilities of committed tokens, read back from the hidden-state pool after a step.

Every path that commits tokens (the eager step, a decode graph's replay, K decode steps, a
verify graph, the eager verify) leaves the final hidden row of each computed position in the
pool, and the token committed after position p was chosen from the logits of p's row (after a
verify, compaction has moved the accepted path's rows into the committed positions). So one
small pass over just those rows after the step gives the step's own distribution: no captured
graph changes, and requests that did not ask pay nothing.

What is reported is the model's raw distribution, the log-softmax of the logits before
temperature, top-k/top-p and penalties (vLLM's default too). Under speculation it is the
target's at each committed position, never the drafter's; with ``--exact`` a token's hidden
row and logits have the same bits in any step, so speculative and target-only decoding report
the same values bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model_runtime.llama import LlamaForCausalLM
from model_runtime.pools import SlotPools
from target_service.admission import MAX_TOP_LOGPROBS, StepItem, VerifyItem
from target_service.device_batch import DeviceBatch
from target_service.request_table import RequestState

__all__ = ["MAX_TOP_LOGPROBS", "LogprobQuery", "TokenLogprobs", "read_logprobs"]


@dataclass(frozen=True)
class LogprobQuery:
    """One request's tokens of a step: ``token_ids[j]`` was chosen from the row of position
    ``first_position + j`` of slot-table row ``row``."""

    row: int
    first_position: int
    token_ids: list[int]
    top: int  # how many most likely tokens to report at each position


@dataclass
class TokenLogprobs:
    token_logprobs: list[float]  # one per token
    top_ids: list[int]  # ``top`` per token, token-major, most likely first
    top_logprobs: list[float]


def forward_queries(
    items: list[StepItem], states: list[RequestState], next_ids: list[int], steps: int
) -> list[LogprobQuery | None] | None:
    """One query per sampled item of a Forward (its ``steps`` ids), None for an item whose
    request did not ask; None in all when none did."""
    sampled = [(it, st) for it, st in zip(items, states, strict=True) if it.sample]
    if not any(st.sampling.logprobs for _, st in sampled):
        return None
    queries: list[LogprobQuery | None] = []
    for i, (item, state) in enumerate(sampled):
        spec = state.sampling
        last = item.start_pos + len(item.token_ids) - 1  # K steps: the one token's position
        block = next_ids[i * steps : (i + 1) * steps]
        query = LogprobQuery(state.row, last, block, spec.top_logprobs)
        queries.append(query if spec.logprobs else None)
    return queries


def verify_queries(
    items: list[VerifyItem], states: list[RequestState], token_ids: list[list[int]]
) -> list[LogprobQuery | None] | None:
    """One query per verified tree whose request asked (its committed ids, the first chosen
    at the root's position), None for the others; None in all when none did."""
    if not any(st.sampling.logprobs for st in states):
        return None
    return [
        LogprobQuery(st.row, it.start_pos, ids, st.sampling.top_logprobs)
        if st.sampling.logprobs
        else None
        for it, st, ids in zip(items, states, token_ids, strict=True)
    ]


def read_logprobs(
    model: LlamaForCausalLM,
    pools: SlotPools,
    slot_table: torch.Tensor,
    queries: Sequence[LogprobQuery | None],
) -> list[TokenLogprobs | None]:
    """The answer to each query (None where there is none), from one pass over the rows the
    queries name and one device->host copy, after the step."""
    asked = [q for q in queries if q is not None]
    if not asked:
        return [None] * len(queries)
    rows, positions, tokens = _flatten(asked)
    device = slot_table.device
    index = torch.tensor([rows, positions, tokens], dtype=torch.int64).to(device)
    with torch.inference_mode():
        slots = slot_table[index[0], index[1]]
        top = max(q.top for q in asked)
        host = device_pass(model, pools.hidden[slots], index[2], top).tolist()
    answers = iter(host)
    return [
        answer_from_rows([next(answers) for _ in q.token_ids], q.top) if q is not None else None
        for q in queries
    ]


def device_pass(
    model: LlamaForCausalLM, hidden_rows: torch.Tensor, tokens: torch.Tensor, top: int
) -> torch.Tensor:
    """[M, 1 + 2 * top] on the device, no sync: per row, the log-probability of its token,
    then the ``top`` largest and their ids (as floats: one copy carries them all; exact in
    float32 below 2**24 ids, wider vocabularies pack in float64)."""
    logprobs = torch.log_softmax(model.logits(hidden_rows), dim=-1)
    chosen = logprobs.gather(1, tokens[:, None])
    if not top:
        return chosen
    values, ids = logprobs.topk(top, dim=-1)
    dtype = torch.float32 if logprobs.shape[-1] <= 2**24 else torch.float64
    return torch.cat([chosen.to(dtype), values.to(dtype), ids.to(dtype)], 1)


def decode_pass(
    model: LlamaForCausalLM,
    pools: SlotPools,
    slot_table: torch.Tensor,
    batch: DeviceBatch,
    ids: torch.Tensor,
    top: int,
) -> torch.Tensor:
    """``device_pass`` over decode steps' rows, no sync: item i's token k ([R, K] ``ids``) was
    chosen at position ``batch.positions[i] + k``. Every item's rows (no host index to copy):
    the caller keeps those of the requests that asked."""
    offsets = torch.arange(ids.shape[1], device=ids.device)
    slots = slot_table[batch.rows[:, None], batch.positions[:, None] + offsets]
    return device_pass(model, pools.hidden[slots.flatten()], ids.flatten(), top)


def split_shares(
    host: list[list[float]], tops: list[int | None], lengths: list[int]
) -> list[TokenLogprobs | None]:
    """``host`` holds an equal share of rows per request, in order; a request's answer is the
    first ``lengths[i]`` rows of its share (None for one whose ``tops`` entry is None)."""
    share = len(host) // len(tops)
    return [
        None if top is None else answer_from_rows(host[i * share : i * share + n], top)
        for i, (top, n) in enumerate(zip(tops, lengths, strict=True))
    ]


def answer_from_rows(rows: list[list[float]], top: int) -> TokenLogprobs:
    """One request's answer from its rows of ``device_pass`` (a row per token)."""
    answer = TokenLogprobs([], [], [])
    for row in rows:
        width = (len(row) - 1) // 2  # the pass's top, at least this request's
        answer.token_logprobs.append(row[0])
        answer.top_logprobs += row[1 : 1 + top]
        answer.top_ids += [int(i) for i in row[1 + width : 1 + width + top]]
    return answer


def _flatten(queries: list[LogprobQuery]) -> tuple[list[int], list[int], list[int]]:
    rows: list[int] = []
    positions: list[int] = []
    tokens: list[int] = []
    for q in queries:
        count = len(q.token_ids)
        rows += [q.row] * count
        positions += range(q.first_position, q.first_position + count)
        tokens += q.token_ids
    return rows, positions, tokens
