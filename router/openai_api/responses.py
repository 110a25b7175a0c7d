"""OpenAI response objects and stream chunks built from the router's stream items."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from protos import generation_pb2 as pb
from router.openai_api.echo import Echo, joined
from router.openai_api.logprobs import chat_logprobs, completion_logprobs, text_len

FINISH_REASONS: dict[int, str] = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_EOS: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
}


def usage(final: pb.GenerateResponse) -> dict[str, Any]:
    """OpenAI usage plus ``speculation``: this request's verify steps, drafts and acceptance
    (null when it ran target-only)."""
    u = final.usage
    spec = None
    if final.HasField("speculation"):
        s = final.speculation
        spec = {
            "verify_steps": s.verify_steps,
            "draft_tokens": s.draft_tokens,
            "accepted_tokens": s.accepted_tokens,
            "mean_acceptance_length": s.mean_acceptance_length,
        }
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "speculation": spec,
    }


@dataclass
class Reply:
    """One request's reply in the shape of its endpoint (chat or text completion)."""

    chat: bool
    model: str
    include_usage: bool = False
    logprobs: bool = False  # the request asked for them: items carry one entry per token
    echo: Echo | None = None  # completions with echo: the prompt leads
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # Where a completion stream's next tokens start in its text (their text_offset).
    _text_offset: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def whole(self, merged: pb.GenerateResponse) -> dict[str, Any]:
        """The reply to a request that did not stream; ``merged`` is all its items merged:
        their text and logprobs joined, the last item's finish fields."""
        prompt = self._echoed(merged)
        merged = self.echo.reply_item(merged) if self.echo else merged
        reason = FINISH_REASONS.get(merged.finish_reason, "stop")
        if self.chat:
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": merged.text}}
        else:
            choice = {"text": (self.echo.text if self.echo else "") + merged.text}
        logprobs = joined(prompt, self._logprobs(merged))
        choice.update(index=0, finish_reason=reason, logprobs=logprobs)
        return {**self._head(False), "choices": [choice], "usage": usage(merged)}

    def chunks(self, item: pb.GenerateResponse, first: bool) -> list[str]:
        """SSE events for one stream item: its text and tokens' logprobs, then its finish and
        usage if last."""
        events = []
        if self.chat and first:
            events.append(self._chunk({"role": "assistant", "content": ""}, None))
        if self.echo and first:
            events.append(self._chunk(self.echo.text, None, self._echoed(item)))
        item = self.echo.reply_item(item) if self.echo else item
        if item.text or item.logprobs:  # a token without text yet (EOS, half a character)
            delta = {"content": item.text} if self.chat else item.text
            events.append(self._chunk(delta, None, self._logprobs(item)))
        if item.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            reason = FINISH_REASONS.get(item.finish_reason, "stop")
            events.append(self._chunk({} if self.chat else "", reason))
            if self.include_usage:
                events.append(sse({**self._head(True), "choices": [], "usage": usage(item)}))
        return events

    def _echoed(self, item: pb.GenerateResponse) -> dict[str, Any] | None:
        """The echoed prompt's logprobs (on the first item), where the request asked."""
        if self.echo is None or not self.logprobs:
            return None
        self._text_offset = self.echo.logprobs_len(item.prompt_logprobs)
        return self.echo.logprobs(item.prompt_logprobs)

    def _logprobs(self, item: pb.GenerateResponse) -> dict[str, Any] | None:
        """``item``'s tokens' logprobs in this endpoint's shape; a completion's offsets run on
        from the tokens before them."""
        if not self.logprobs:
            return None
        if self.chat:
            return chat_logprobs(item.logprobs)
        shaped = completion_logprobs(item.logprobs, self._text_offset)
        self._text_offset += text_len(item.logprobs)
        return shaped

    def _chunk(self, delta: Any, reason: str | None, logprobs: Any = None) -> str:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": logprobs}
        choice["delta" if self.chat else "text"] = delta
        body = {**self._head(True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None  # every chunk but the last has usage null
        return sse(body)

    def _head(self, stream: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if stream else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
