"""Completions' ``best_of``: best_of candidates a prompt, the n best of them returned.

The candidates are fanned out exactly as n choices are (router/openai_api/choices.py: candidate
i samples with seed + i where the body gave a seed). "Best" is OpenAI's "highest log probability
per token": the mean of the target's logprobs of a candidate's completion tokens (vLLM's V0
ranked by their sum, which favours short candidates). To rank them the router asks the target
for the chosen tokens' logprobs even when the client did not; the reply then shows none.

The returned choices are indexed 0..n-1 a prompt, best first (a tie keeps candidate order);
``usage.completion_tokens`` counts every candidate's tokens, as OpenAI bills them. A stream
cannot show only the best before all have finished, so ``stream`` with best_of > n is refused,
as OpenAI refuses it; chat completions have no best_of (OpenAI's chat API has none, vLLM V1
dropped it), so there anything but 1 is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from protos import generation_pb2 as pb
from router.openai_api.choices import MAX_CHOICES, MAX_REQUESTS
from router.openai_api.errors import ApiError
from router.openai_api.logprobs import LOGPROB_FLOOR
from router.openai_api.values import is_int


def parse_best_of(body: dict[str, Any], n: int, stream: bool, num_prompts: int) -> int:
    """The body's best_of (n where it gave none), checked against n, stream and the limits."""
    best_of = body.get("best_of")
    if best_of is None:
        return n
    if not is_int(best_of) or not 1 <= best_of <= MAX_CHOICES:
        raise ApiError(400, f"best_of must be an integer in [1, {MAX_CHOICES}], got {best_of!r}",
                       "best_of")  # fmt: skip
    if best_of < n:
        raise ApiError(400, f"best_of ({best_of}) must be at least n ({n})", "best_of")
    if stream and best_of > n:
        raise ApiError(400, "best_of > n cannot be streamed: the best are known only once "
                       "every candidate has finished", "best_of")  # fmt: skip
    if num_prompts * best_of > MAX_REQUESTS:
        raise ApiError(400, f"{num_prompts} prompts x best_of {best_of} exceed {MAX_REQUESTS} "
                       "candidates a request", "best_of")  # fmt: skip
    return best_of


def refuse_in_chat(body: dict[str, Any]) -> None:
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "best_of is not supported by chat completions (must be 1); it is a "
                       "/v1/completions parameter", "best_of")  # fmt: skip


def mean_logprob(whole: pb.GenerateResponse) -> float:
    """A candidate's score: the mean logprob of its completion tokens (floored as the reply
    writes them, so that a ruled-out token does not make every mean -inf); none scores 0."""
    if not whole.logprobs:
        return 0.0
    total = sum(max(entry.chosen.logprob, LOGPROB_FLOOR) for entry in whole.logprobs)
    return total / len(whole.logprobs)


def ranked(wholes: Sequence[pb.GenerateResponse], n: int, best_of: int) -> list[int]:
    """Which candidates the reply returns, in its order: prompt by prompt (each one's best_of
    candidates adjacent, as fanned out), the n best of each, best first, ties in candidate
    order. Without best_of > n, every one in order: n choices are not ranked."""
    if best_of <= n:
        return list(range(len(wholes)))
    chosen: list[int] = []
    for start in range(0, len(wholes), best_of):
        group = range(start, min(start + best_of, len(wholes)))
        by_score = sorted(group, key=lambda i: -mean_logprob(wholes[i]))  # stable: ties keep order
        chosen.extend(by_score[:n])
    return chosen
