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
from router.openai_api.tool_parse import Parsed, ToolCallParser

FINISH_REASONS: dict[int, str] = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_EOS: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
}


def usage(*finals: pb.GenerateResponse, n: int = 1) -> dict[str, Any]:
    """OpenAI usage of a reply's choices (their requests' last items, n a prompt) plus
    ``speculation``: their verify steps, drafts and acceptance (null when they ran
    target-only). Each prompt counts once, as OpenAI counts it for n choices; the completions
    add up."""
    firsts = [f.usage for f in finals[::n]]  # one choice of each prompt
    prompt = sum(u.prompt_tokens for u in firsts)
    completion = sum(f.usage.completion_tokens for f in finals)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(u.cached_tokens for u in firsts)},
        "speculation": _speculation([f.speculation for f in finals if f.HasField("speculation")]),
    }


def _speculation(stats: list[pb.SpeculationStats]) -> dict[str, Any] | None:
    if not stats:
        return None
    steps = sum(s.verify_steps for s in stats)
    committed = sum(s.mean_acceptance_length * s.verify_steps for s in stats)
    return {
        "verify_steps": steps,
        "draft_tokens": sum(s.draft_tokens for s in stats),
        "accepted_tokens": sum(s.accepted_tokens for s in stats),
        "mean_acceptance_length": committed / steps if steps else 0.0,
        "forced_tokens": sum(s.forced_tokens for s in stats),
    }


@dataclass
class Reply:
    """One request's reply in the shape of its endpoint (chat or text completion)."""

    chat: bool
    model: str
    include_usage: bool = False
    logprobs: bool = False  # the request asked for them: items carry one entry per token
    echo: Echo | None = None  # completions with echo: the prompt leads
    index: int = 0  # the choice's (OpenAI's n: router/openai_api/choices.py)
    id: str = ""
    tool_parser: ToolCallParser | None = None  # chat with tools: the text is read for calls
    created: int = field(default_factory=lambda: int(time.time()))
    # Where a completion stream's next tokens start in its text (their text_offset).
    _text_offset: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.id = self.id or ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def whole(self, merged: pb.GenerateResponse) -> dict[str, Any]:
        """The reply to a request that did not stream; ``merged`` is all its items merged:
        their text and logprobs joined, the last item's finish fields."""
        prompt = self._echoed(merged)
        merged = self.shown(merged)
        if self.chat:
            choice: dict[str, Any] = {"message": self._message(merged.text)}
        else:
            choice = {"text": (self.echo.text if self.echo else "") + merged.text}
        logprobs = joined(prompt, self._logprobs(merged))
        reason = self._reason(merged.finish_reason)  # after _message: it counts the calls
        choice.update(index=self.index, finish_reason=reason, logprobs=logprobs)
        return {**self._head(False), "choices": [choice], "usage": usage(merged)}

    def chunks(self, item: pb.GenerateResponse, first: bool) -> list[str]:
        """SSE events for one stream item: its text and tokens' logprobs, then its finish if
        last (the reply's usage chunk comes after every choice's: ``usage_chunk``)."""
        events = []
        if self.chat and first:
            events.append(self._chunk({"role": "assistant", "content": ""}, None))
        if self.echo and first:
            events.append(self._chunk(self.echo.text, None, self._echoed(item)))
        item = self.shown(item)
        last = item.finish_reason != pb.FINISH_REASON_UNSPECIFIED
        parsed = self._parsed(item.text, last)
        if parsed.content or item.logprobs:  # a token without text yet (EOS, half a character)
            delta = {"content": parsed.content} if self.chat else parsed.content
            events.append(self._chunk(delta, None, self._logprobs(item)))
        for delta in parsed.deltas:  # whole calls, or a checked call's start and pieces
            events.append(self._chunk({"tool_calls": [delta]}, None))
        if last:
            events.append(self._chunk({} if self.chat else "", self._reason(item.finish_reason)))
        return events

    def _parsed(self, text: str, last: bool) -> Parsed:
        """A stream item's text as content and tool calls (all content without tools)."""
        if self.tool_parser is None:
            return Parsed(text)
        parsed = self.tool_parser.feed(text)
        return parsed + self.tool_parser.finish() if last else parsed

    def _message(self, text: str) -> dict[str, Any]:
        """A whole chat reply's message: with tools, the calls apart from the content (null
        when there is none beside them)."""
        parsed = self._parsed(text, last=True)
        if not parsed.calls:
            return {"role": "assistant", "content": parsed.content}
        calls = [{k: v for k, v in call.items() if k != "index"} for call in parsed.calls]
        return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}

    def _reason(self, finish_reason: int) -> str:
        """OpenAI's finish_reason; "tool_calls" when the model stopped after making calls
        (a reply cut by max_tokens stays "length", and one a stop string cut inside a call
        "stop")."""
        reason = FINISH_REASONS.get(finish_reason, "stop")
        parser = self.tool_parser
        made_calls = parser is not None and parser.num_calls > 0 and not parser.cut
        return "tool_calls" if made_calls and reason == "stop" else reason

    def shown(self, item: pb.GenerateResponse) -> pb.GenerateResponse:
        """The item as this reply shows it (echo's scores-only drops the sampled token)."""
        return self.echo.reply_item(item) if self.echo else item

    def usage_chunk(self, finals: list[pb.GenerateResponse], n: int = 1) -> str:
        """With include_usage, the stream's last chunk before [DONE]: no choices, the usage
        (``finals``: every choice's last item, n a prompt)."""
        return sse({**self._head(True), "choices": [], "usage": usage(*finals, n=n)})

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
        choice: dict[str, Any] = {"index": self.index, "finish_reason": reason}
        choice["logprobs"] = logprobs
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
