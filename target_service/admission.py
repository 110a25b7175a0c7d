"""What a step may ask of the target: its items, and the checks run before any state changes.

Every item of a Forward or a Verify is validated first; only then are new requests opened and
the new slots written into the slot table, so a bad step leaves the target as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from target_service.errors import InvalidStep, UnknownRequest
from target_service.penalties import has_penalty
from target_service.request_table import RequestState, RequestTable, SamplingSpec
from target_service.token_masks import check_mask
from target_service.tree_batch import check_tree

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs (target_service/logprobs.py)


@dataclass
class StepItem:
    """One request's share of a step (decoded from a ForwardItem)."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    new_slots: list[int] = field(default_factory=list)
    sample: bool = True
    sampling: SamplingSpec | None = None
    scored_ids: list[int] = field(default_factory=list)  # prompt_scores.py
    allowed_tokens: bytes = b""  # structured output's mask for the sampled token (token_masks.py)


@dataclass
class VerifyItem:
    """One request's draft tree (decoded from a VerifyItem message)."""

    request_id: str
    start_pos: int
    token_ids: list[int]
    parents: list[int]
    new_slots: list[int] = field(default_factory=list)
    return_hidden: bool = False
    allowed_tokens: bytes = b""  # a mask per node, node-major (token_masks.py)


@dataclass(frozen=True)
class StepLimits:
    max_batch_tokens: int
    max_context: int
    vocab_size: int
    max_position: int
    max_tree_tokens: int
    max_decode_steps: int = 1


def admit_step(
    table: RequestTable, limits: StepLimits, items: list[StepItem], decode_steps: int = 1
) -> list[RequestState]:
    """Validates every item, then opens new requests and appends every item's new slots."""
    _check_step_shape(limits, items)
    # An item that carries sampling opens its request: a state still held under its id belongs
    # to an earlier request whose release never arrived (a step failed while the target
    # stalled, and the client retried under the same id). Taken for this one's, it mapped the
    # new positions to the old request's slots, which the router has given to others since.
    found = [None if it.sampling is not None else table.find(it.request_id) for it in items]
    for item, state in zip(items, found, strict=True):
        if state is None:
            _check_new(item, limits.vocab_size)
        _check_item(table, limits, item, state, decode_steps)
    states = [
        st if st is not None else table.open(it.request_id, it.sampling)  # type: ignore[arg-type]
        for it, st in zip(items, found, strict=True)
    ]
    table.append([(st, it.new_slots) for it, st in zip(items, states, strict=True)])
    return states


def _check_new(item: StepItem, vocab: int) -> None:
    """A request's first item: it must carry sampling parameters the target can honour."""
    if item.sampling is None:
        raise UnknownRequest(f"request {item.request_id!r} is new but carries no sampling")
    bias = item.sampling.logit_bias
    bad_bias = [(t, b) for t, b in bias if not (0 <= t < vocab and -100 <= b <= 100)]
    if bad_bias:
        raise InvalidStep(
            f"request {item.request_id!r}: logit_bias needs token ids in [0, {vocab}) and values "
            f"in [-100, 100], got {bad_bias[:4]}"
        )
    if item.sampling.top_logprobs > MAX_TOP_LOGPROBS:
        raise InvalidStep(
            f"request {item.request_id!r}: top_logprobs {item.sampling.top_logprobs} exceeds "
            f"{MAX_TOP_LOGPROBS}"
        )
    _check_sampling_rules(item.request_id, item.sampling, vocab)


def _check_sampling_rules(request_id: str, spec: SamplingSpec, vocab: int) -> None:
    """min_p, repetition_penalty and min_tokens' ids: values the math is defined for."""
    if not 0 <= spec.min_p <= 1:  # NaN fails too
        raise InvalidStep(f"request {request_id!r}: min_p must be in [0, 1], got {spec.min_p}")
    if not 0 < spec.repetition_penalty < float("inf"):
        raise InvalidStep(
            f"request {request_id!r}: repetition_penalty must be > 0, got {spec.repetition_penalty}"
        )
    ids = (*spec.repetition_context, *spec.min_tokens_banned_ids)
    if any(not 0 <= t < vocab for t in ids):
        raise InvalidStep(
            f"request {request_id!r}: repetition_context and min_tokens_banned_ids need token "
            f"ids in [0, {vocab})"
        )


def _check_step_shape(limits: StepLimits, items: list[StepItem]) -> None:
    if not items:
        raise InvalidStep("a step needs at least one item")
    ids = [it.request_id for it in items]
    if len(set(ids)) != len(ids):
        raise InvalidStep("a request may appear once per step")
    total = sum(len(it.token_ids) for it in items)
    if total > limits.max_batch_tokens:
        raise InvalidStep(f"{total} tokens exceed max_batch_tokens {limits.max_batch_tokens}")


def _check_item(
    table: RequestTable,
    limits: StepLimits,
    item: StepItem,
    state: RequestState | None,
    decode_steps: int,
) -> None:
    if not item.token_ids:
        raise InvalidStep(f"request {item.request_id!r}: no tokens to run")
    vocab = limits.vocab_size
    if any(not 0 <= t < vocab for t in item.token_ids):
        raise InvalidStep(f"request {item.request_id!r}: token id outside [0, {vocab})")
    _check_scored(item, vocab)
    check_mask(item.request_id, item.allowed_tokens, vocab)
    if item.allowed_tokens and not (item.sample and decode_steps == 1):
        raise InvalidStep(
            f"request {item.request_id!r}: allowed_tokens needs sample = true and decode_steps 1"
        )
    if decode_steps > 1:
        _check_multi_step(limits, item, state, decode_steps)
    table_len = (state.table_len if state else 0) + len(item.new_slots)
    # K decode steps run positions start_pos .. start_pos + K - 1 from one token.
    end = item.start_pos + max(len(item.token_ids), decode_steps)
    if item.start_pos < 0 or end > table_len:
        raise InvalidStep(
            f"request {item.request_id!r}: positions [{item.start_pos}, {end}) not covered "
            f"by its {table_len} slots"
        )
    if end > limits.max_context:
        raise InvalidStep(f"request {item.request_id!r}: context {end} > {limits.max_context}")
    probe = state or RequestState(0, 0, item.sampling)  # type: ignore[arg-type]
    table.check_append(probe, item.new_slots)


def _check_scored(item: StepItem, vocab: int) -> None:
    """scored_ids[i] is scored under token i's row: at most one per token, in the vocabulary."""
    if len(item.scored_ids) > len(item.token_ids):
        raise InvalidStep(
            f"request {item.request_id!r}: {len(item.scored_ids)} scored ids for "
            f"{len(item.token_ids)} tokens (at most one per token)"
        )
    if any(not 0 <= t < vocab for t in item.scored_ids):
        raise InvalidStep(f"request {item.request_id!r}: scored id outside [0, {vocab})")


def _check_multi_step(
    limits: StepLimits, item: StepItem, state: RequestState | None, decode_steps: int
) -> None:
    """K > 1 decode steps: one sampled token per item, no penalties (their counts are kept
    from host lists, between steps), at most the advertised number of steps."""
    if decode_steps > limits.max_decode_steps:
        raise InvalidStep(
            f"decode_steps {decode_steps} exceeds the target's max_decode_steps "
            f"{limits.max_decode_steps}"
        )
    if len(item.token_ids) != 1 or not item.sample or item.scored_ids:
        raise InvalidStep(
            f"request {item.request_id!r}: decode_steps {decode_steps} needs one token with "
            f"sample = true and no scored ids, got {len(item.token_ids)} tokens, sample = "
            f"{item.sample}, {len(item.scored_ids)} scored ids"
        )
    probe = state or (RequestState(0, 0, item.sampling) if item.sampling else None)
    if probe is not None and has_penalty(probe):
        raise InvalidStep(
            f"request {item.request_id!r}: penalties and logit_bias need decode_steps 1 "
            "(presence/frequency, repetition_penalty, min_tokens until met)"
        )


def admit_trees(
    table: RequestTable, limits: StepLimits, items: list[VerifyItem]
) -> list[RequestState]:
    """Validates every tree before touching state; trees run on started requests only."""
    if not items:
        raise InvalidStep("a verify needs at least one tree")
    if len({it.request_id for it in items}) != len(items):
        raise InvalidStep("a request may appear once per verify")
    if sum(len(it.token_ids) for it in items) > limits.max_batch_tokens:
        raise InvalidStep(f"trees exceed max_batch_tokens {limits.max_batch_tokens}")
    for item in items:  # the trees' own shape first: it needs no state
        check_tree(item.request_id, item.token_ids, item.parents, limits.vocab_size)
        check_mask(item.request_id, item.allowed_tokens, limits.vocab_size, len(item.token_ids))
        if len(item.token_ids) > limits.max_tree_tokens:
            raise InvalidStep(
                f"request {item.request_id!r}: a tree of {len(item.token_ids)} nodes exceeds the "
                f"target's max_tree_tokens {limits.max_tree_tokens}"
            )
    states = [table.get(it.request_id) for it in items]
    for item, state in zip(items, states, strict=True):
        end = item.start_pos + len(item.token_ids)
        if item.start_pos < 1 or end > state.table_len + len(item.new_slots):
            raise InvalidStep(
                f"request {item.request_id!r}: tree positions "
                f"[{item.start_pos}, {end}) not covered by its slots"
            )
        if end > limits.max_position:
            raise InvalidStep(
                f"request {item.request_id!r}: tree runs past position {limits.max_position}"
            )
        table.check_append(state, item.new_slots)
    table.append([(st, it.new_slots) for it, st in zip(items, states, strict=True)])
    return states
