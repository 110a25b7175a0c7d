"""Turns a public GenerateRequest into prompt ids and SamplingOptions, or says what is wrong."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from protos import generation_pb2
from router.chat_input import template_input
from router.errors import InvalidRequest
from router.request import SamplingOptions
from router.tokenizer import Tokenizer

MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20  # OpenAI's limit; the target's too (target_service/admission.py)


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_context: int  # longest prompt + completion the target accepts
    max_new_tokens_limit: int
    default_max_new_tokens: int


def prompt_ids(
    request: generation_pb2.GenerateRequest, tokenizer: Tokenizer, limits: Limits
) -> list[int]:
    kind = request.WhichOneof("input")
    if kind is None:
        raise InvalidRequest("input is empty: set one of text, messages or input_ids", "input")
    if kind == "text":
        ids = tokenizer.encode(request.text) if request.text else []
    elif kind == "messages":
        ids = _chat_ids(request, tokenizer)
    else:
        ids = list(request.input_ids.ids)
        bad = [i for i in ids if not 0 <= i < limits.vocab_size]
        if bad:
            raise InvalidRequest(
                f"input_ids out of vocabulary [0, {limits.vocab_size}): {bad[:8]}", "input"
            )
    if not ids:
        raise InvalidRequest(f"input is empty: {kind} gives no tokens", "input")
    if len(ids) >= limits.max_context:
        raise InvalidRequest(
            f"prompt has {len(ids)} tokens; the context holds {limits.max_context} "
            "(prompt plus at least one new token)",
            "input",
        )
    return ids


def _chat_ids(request: generation_pb2.GenerateRequest, tokenizer: Tokenizer) -> list[int]:
    if not request.messages.items:
        raise InvalidRequest("messages is empty", "input")
    try:
        chat = template_input(request.messages)
        return tokenizer.apply_chat_template(chat.messages, chat.tools)
    except ValueError as err:
        raise InvalidRequest(str(err), "input") from err


def sampling_options(
    request: generation_pb2.GenerateRequest,
    prompt_len: int,
    limits: Limits,
    eos_token_ids: Sequence[int] = (),
) -> SamplingOptions:
    """``eos_token_ids``: the tokenizer's, which min_tokens keeps from being sampled."""
    s = request.sampling
    max_new = _max_new_tokens(s, prompt_len, limits)
    temperature = s.temperature if s.HasField("temperature") else 1.0
    top_p = s.top_p if s.HasField("top_p") else 1.0
    top_k = s.top_k if s.HasField("top_k") else 0
    if not math.isfinite(temperature) or temperature < 0:
        raise InvalidRequest(
            f"temperature must be >= 0 (0 is greedy), got {temperature}", "temperature"
        )
    if not (0 < top_p <= 1):
        raise InvalidRequest(f"top_p must be in (0, 1], got {top_p}", "top_p")
    if top_k < 0:
        raise InvalidRequest(f"top_k must be >= 0 (0 is off), got {top_k}", "top_k")
    stop_ids = frozenset(s.stop_token_ids)
    bad = [i for i in stop_ids if not 0 <= i < limits.vocab_size]
    if bad:
        raise InvalidRequest(
            f"stop_token_ids out of vocabulary [0, {limits.vocab_size}): {bad[:8]}",
            "stop_token_ids",
        )
    if len(s.stop) > MAX_STOP_STRINGS or any(not x for x in s.stop):
        raise InvalidRequest(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", "stop")
    seed = s.seed if s.HasField("seed") else secrets.randbits(63)
    presence, frequency = _penalties(s)
    logprobs, top_logprobs, prompt_logprobs = _logprobs(s)
    min_p, repetition, min_tokens = _vllm_extras(s, max_new)
    banned = (*([] if s.ignore_eos else eos_token_ids), *sorted(stop_ids)) if min_tokens else ()
    return SamplingOptions(
        max_new, temperature, top_p, top_k, seed, tuple(s.stop), stop_ids, s.ignore_eos,
        presence, frequency, logprobs, top_logprobs, prompt_logprobs,
        _logit_bias(s, limits.vocab_size), min_p, repetition, min_tokens,
        tuple(dict.fromkeys(banned)),
    )  # fmt: skip


def _vllm_extras(s: generation_pb2.SamplingParams, max_new: int) -> tuple[float, float, int]:
    """min_p, repetition_penalty and min_tokens, as vLLM takes them."""
    min_p = s.min_p if s.HasField("min_p") else 0.0
    if not 0 <= min_p <= 1:  # NaN fails too
        raise InvalidRequest(f"min_p must be in [0, 1] (0 is off), got {min_p}", "min_p")
    repetition = s.repetition_penalty if s.HasField("repetition_penalty") else 1.0
    if not 0 < repetition <= 2:
        raise InvalidRequest(
            f"repetition_penalty must be in (0, 2] (1 is off), got {repetition}",
            "repetition_penalty",
        )
    # Against the max_new_tokens asked for (the context's room may cut it shorter: LENGTH).
    limit = s.max_new_tokens if s.HasField("max_new_tokens") else max_new
    if s.min_tokens > limit:
        raise InvalidRequest(
            f"min_tokens {s.min_tokens} exceeds max_new_tokens {limit}", "min_tokens"
        )
    return min_p, repetition, s.min_tokens


def _penalties(s: generation_pb2.SamplingParams) -> tuple[float, float]:
    values = (s.presence_penalty, s.frequency_penalty)  # unset reads 0: off
    for name, value in zip(("presence_penalty", "frequency_penalty"), values, strict=True):
        if not (math.isfinite(value) and -2 <= value <= 2):
            raise InvalidRequest(f"{name} must be in [-2, 2], got {value}", name)
    return values


def _logit_bias(s: generation_pb2.SamplingParams, vocab: int) -> tuple[tuple[int, float], ...]:
    bad_ids = [t for t in s.logit_bias if not 0 <= t < vocab]
    if bad_ids:
        raise InvalidRequest(
            f"logit_bias token ids out of vocabulary [0, {vocab}): {bad_ids[:8]}", "logit_bias"
        )
    bad = [(t, b) for t, b in s.logit_bias.items() if not (math.isfinite(b) and -100 <= b <= 100)]
    if bad:
        raise InvalidRequest(
            f"logit_bias values must be in [-100, 100], got {bad[:8]}", "logit_bias"
        )
    return tuple(sorted(s.logit_bias.items()))


def _logprobs(s: generation_pb2.SamplingParams) -> tuple[bool, int, bool]:
    if s.top_logprobs and not (s.logprobs or s.prompt_logprobs):
        raise InvalidRequest(
            "top_logprobs needs logprobs or prompt_logprobs = true", "top_logprobs"
        )
    if s.top_logprobs > MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {s.top_logprobs}",
            "top_logprobs",
        )
    return s.logprobs, s.top_logprobs, s.prompt_logprobs


def _max_new_tokens(s: generation_pb2.SamplingParams, prompt_len: int, limits: Limits) -> int:
    room = limits.max_context - prompt_len
    if not s.HasField("max_new_tokens"):
        return min(limits.default_max_new_tokens, limits.max_new_tokens_limit, room)
    value = s.max_new_tokens
    if value == 0:
        raise InvalidRequest("max_new_tokens must be at least 1", "max_new_tokens")
    if value > limits.max_new_tokens_limit:
        raise InvalidRequest(
            f"max_new_tokens {value} exceeds the server limit {limits.max_new_tokens_limit}",
            "max_new_tokens",
        )
    # A completion never runs past the context: it ends with finish_reason LENGTH there.
    return min(value, room)
