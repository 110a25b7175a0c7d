"""The sampling parameters of an OpenAI body (and vLLM's extras) set on the router's
SamplingParams, with a 400 naming the key whose value is wrong."""

from __future__ import annotations

from typing import Any

from protos import generation_pb2 as pb
from router.openai_api.errors import ApiError
from router.openai_api.formats import set_format
from router.openai_api.values import is_int, is_int64, is_number
from router.openai_api.vllm_sampling import vllm_sampling
from router.validation import MAX_TOP_LOGPROBS

UINT64 = (1 << 64) - 1


def chat_logprobs(s: pb.SamplingParams, body: dict[str, Any]) -> None:
    """Chat's ``logprobs: bool`` and ``top_logprobs: int``; like OpenAI and vLLM, a
    top_logprobs (even 0) needs logprobs true."""
    s.logprobs = flag(body, "logprobs")
    top = body.get("top_logprobs")
    if top is None:
        return
    if not s.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    s.top_logprobs = _top_count(top, "top_logprobs")


def completion_logprobs(s: pb.SamplingParams, body: dict[str, Any]) -> None:
    """Completions' ``logprobs: int``: how many top tokens beside the chosen one (0: the
    chosen one only); null is off."""
    top = body.get("logprobs")
    if top is not None:
        s.logprobs = True
        s.top_logprobs = _top_count(top, "logprobs")


def _top_count(value: Any, key: str) -> int:
    # The router's validation checks the range again for gRPC; here the 400 names the key.
    if not is_int(value) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ApiError(
            400, f"{key} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {value!r}", key
        )
    return value


def sampling(s: pb.SamplingParams, body: dict[str, Any], max_tokens_keys: tuple[str, ...]) -> None:
    for key in max_tokens_keys:
        value = body.get(key)
        if value is None:
            continue
        if not is_int(value) or value < 1:
            raise ApiError(400, f"{key} must be a positive integer, got {value!r}", key)
        s.max_new_tokens = min(value, (1 << 32) - 1)
        break
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        value = body.get(key)
        if value is not None:
            if not is_number(value):
                raise ApiError(400, f"{key} must be a number, got {value!r}", key)
            setattr(s, key, float(value))
    for key in ("seed", "top_k"):
        value = body.get(key)
        if value is not None and not is_int(value):
            raise ApiError(400, f"{key} must be an integer, got {value!r}", key)
    if body.get("seed") is not None:
        s.seed = body["seed"] & UINT64  # OpenAI seeds may be negative; ours are uint64
    if body.get("top_k") is not None and body["top_k"] != -1:  # -1: vLLM's "off"
        s.top_k = max(-(1 << 31), min(body["top_k"], (1 << 31) - 1))
    s.stop.extend(_stop(body.get("stop")))
    ids = body.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(is_int64(i) for i in ids):
        raise ApiError(400, "stop_token_ids must be a list of integers", "stop_token_ids")
    s.stop_token_ids.extend(ids)
    s.ignore_eos = flag(body, "ignore_eos")
    _logit_bias(s, body.get("logit_bias"))
    set_format(s, body)  # structured output (router/openai_api/formats.py)
    vllm_sampling(s, body)  # min_p, repetition_penalty, min_tokens


def _logit_bias(s: pb.SamplingParams, bias: Any) -> None:
    """OpenAI's ``{"token id": bias}`` (ids as strings, as JSON keys are); the values' range
    and the ids' vocabulary are checked with the gRPC API's."""
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise ApiError(400, "logit_bias must be an object of token id -> bias", "logit_bias")
    for key, value in bias.items():
        if not (isinstance(key, str) and key.lstrip("-").isdigit() and is_number(value)):
            raise ApiError(
                400, f"logit_bias: {key!r}: {value!r} is not a token id and a number", "logit_bias"
            )
        token = int(key)
        if not -(1 << 63) <= token < (1 << 63):
            raise ApiError(400, f"logit_bias: token id {key} out of range", "logit_bias")
        s.logit_bias[token] = float(value)


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        return stop
    raise ApiError(400, "stop must be a string or a list of strings", "stop")


def flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false", key)
    return value
