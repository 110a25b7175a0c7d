"""OpenAI response objects and stream chunks built from the router's stream items."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from protos import generation_pb2 as pb

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
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def whole(self, text: str, final: pb.GenerateResponse) -> dict[str, Any]:
        reason = FINISH_REASONS.get(final.finish_reason, "stop")
        if self.chat:
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
        else:
            choice = {"text": text}
        choice.update(index=0, finish_reason=reason, logprobs=None)
        return {**self._head(False), "choices": [choice], "usage": usage(final)}

    def chunks(self, item: pb.GenerateResponse, first: bool) -> list[str]:
        """SSE events for one stream item: its text, then its finish and usage if last."""
        events = []
        if self.chat and first:
            events.append(self._chunk({"role": "assistant", "content": ""}, None))
        if item.text:
            events.append(self._chunk({"content": item.text} if self.chat else item.text, None))
        if item.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
            reason = FINISH_REASONS.get(item.finish_reason, "stop")
            events.append(self._chunk({} if self.chat else "", reason))
            if self.include_usage:
                events.append(sse({**self._head(True), "choices": [], "usage": usage(item)}))
        return events

    def _chunk(self, delta: Any, reason: str | None) -> str:
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
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
