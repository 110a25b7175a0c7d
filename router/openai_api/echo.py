"""Completions' ``echo``: the prompt leads the reply's text, and with ``logprobs`` its tokens
lead the logprob lists, scored by the target (SamplingParams.prompt_logprobs) from the second
token on; the first has none (null), as OpenAI's and vLLM's APIs write it.

``max_tokens: 0`` with ``echo`` scores the prompt alone, as scoring clients send it (vLLM
accepts it too): the router always samples a token after a prefill, so the request runs with
one and the reply drops it (no text, no entries, ``completion_tokens`` 0, finish "length").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protos import generation_pb2 as pb
from router.openai_api.logprobs import completion_logprobs, text_len
from router.request import Request
from router.tokenizer import Tokenizer


@dataclass(frozen=True)
class Echo:
    text: str  # the prompt as the client sent it (decoded where it sent token ids)
    first_token: str  # the text of its first token: the one position without a score
    scores_only: bool  # max_tokens 0: the prompt alone

    @classmethod
    def of(cls, generate: pb.GenerateRequest, req: Request, tokenizer: Tokenizer,
           scores_only: bool) -> Echo:  # fmt: skip
        text = generate.text if generate.HasField("text") else tokenizer.decode(req.prompt_ids)
        return cls(text, tokenizer.decode(req.prompt_ids[:1]), scores_only)

    def logprobs(self, entries: Sequence[pb.LogprobEntry]) -> dict[str, Any]:
        """The prompt's share of the completions shape, offsets from 0."""
        rest = completion_logprobs(entries, len(self.first_token))
        return {
            "tokens": [self.first_token, *rest["tokens"]],
            "token_logprobs": [None, *rest["token_logprobs"]],
            "top_logprobs": [None, *rest["top_logprobs"]],
            "text_offset": [0, *rest["text_offset"]],
        }

    def logprobs_len(self, entries: Sequence[pb.LogprobEntry]) -> int:
        """Where the completion's own offsets start."""
        return len(self.first_token) + text_len(entries)

    def reply_item(self, item: pb.GenerateResponse) -> pb.GenerateResponse:
        """The item as the reply shows it: with ``scores_only`` its sampled token dropped."""
        if not self.scores_only:
            return item
        kept = pb.GenerateResponse()
        kept.CopyFrom(item)
        del kept.token_ids[:], kept.logprobs[:]
        kept.text = ""
        if kept.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            kept.finish_reason = pb.FINISH_REASON_LENGTH
            kept.usage.completion_tokens = 0
        return kept


def joined(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two parts of the completions shape as one (either may be missing)."""
    if first is None or second is None:
        return first or second
    return {key: first[key] + second[key] for key in first}
