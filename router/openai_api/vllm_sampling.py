"""vLLM's sampling extras in OpenAI bodies: min_p, repetition_penalty, min_tokens."""

from __future__ import annotations

from typing import Any

from protos import generation_pb2 as pb
from router.openai_api.errors import ApiError
from router.openai_api.values import is_int, is_number


def vllm_sampling(s: pb.SamplingParams, body: dict[str, Any]) -> None:
    """vLLM's min_p, repetition_penalty and min_tokens (top-level extras, as vLLM takes them;
    the openai client sends them through extra_body). null: unset."""
    ranges = {"min_p": (0.0, 1.0, "[0, 1]"), "repetition_penalty": (0.0, 2.0, "(0, 2]")}
    for key, (low, high, shown) in ranges.items():
        value = body.get(key)
        if value is None:
            continue
        ok = is_number(value) and low <= value <= high and (key == "min_p" or value > low)
        if not ok:
            raise ApiError(400, f"{key} must be a number in {shown}, got {value!r}", key)
        setattr(s, key, float(value))
    value = body.get("min_tokens")
    if value is not None:
        too_many = s.HasField("max_new_tokens") and is_int(value) and value > s.max_new_tokens
        if not is_int(value) or value < 0 or value >= 1 << 32 or too_many:
            raise ApiError(
                400, f"min_tokens must be an integer in [0, max_tokens], got {value!r}",
                "min_tokens",
            )  # fmt: skip
        s.min_tokens = value
