"""The target's log-probabilities (GenerateResponse.logprobs) in OpenAI's two shapes.

Every committed token has one entry, so the lists are as long as ``usage.completion_tokens``:
a token ending the request (EOS, a stop token id) is listed too, and a token that a stop
string cut keeps its whole text. Token strings are the token's own text (an incomplete UTF-8
character reads U+FFFD; ``bytes`` has the exact bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from protos import generation_pb2 as pb

# JSON has no -Infinity; OpenAI and vLLM write a token the model rules out as this.
LOGPROB_FLOOR = -9999.0


def chat_logprobs(entries: Sequence[pb.LogprobEntry]) -> dict[str, Any]:
    """Chat's ``choices[0].logprobs``: one ``content`` item per token, ``top_logprobs`` most
    likely first (empty when the request asked for none)."""
    return {"content": [_chat_entry(entry) for entry in entries]}


def completion_logprobs(entries: Sequence[pb.LogprobEntry], text_offset: int) -> dict[str, Any]:
    """The legacy completions shape: parallel lists, one item per token. ``text_offset`` is
    where the first token starts in the completion's text (a stream's later chunks start past
    0); each next offset adds the previous token's length, as vLLM counts them.

    ``top_logprobs`` holds a ``{token: logprob}`` dict per token, or null per token when the
    request asked for ``logprobs: 0`` (the chosen token only), as vLLM's API documents it.
    """
    tokens = [entry.chosen.token for entry in entries]
    offsets = accumulate((len(token) for token in tokens), initial=text_offset)
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(entry.chosen.logprob) for entry in entries],
        "top_logprobs": [_top_dict(entry.top) for entry in entries],
        "text_offset": list(offsets)[: len(tokens)],
    }


def text_len(entries: Sequence[pb.LogprobEntry]) -> int:
    """How far ``completion_logprobs`` moves the offset: the next chunk starts there."""
    return sum(len(entry.chosen.token) for entry in entries)


def _chat_entry(entry: pb.LogprobEntry) -> dict[str, Any]:
    return {**_chat_token(entry.chosen), "top_logprobs": [_chat_token(t) for t in entry.top]}


def _chat_token(token: pb.TokenLogprob) -> dict[str, Any]:
    return {
        "token": token.token,
        "logprob": _finite(token.logprob),
        "bytes": list(token.token_bytes),
    }


def _top_dict(top: Sequence[pb.TokenLogprob]) -> dict[str, float] | None:
    if not top:  # the target sends top tokens exactly when the request asked for some
        return None
    ranked: dict[str, float] = {}
    for token in top:
        # Two ids can read as one string (U+FFFD halves of a character): keep the likelier.
        ranked.setdefault(token.token, _finite(token.logprob))
    return ranked


def _finite(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)
