"""Tool calls read out of a reply's text, as vLLM's Hermes parser reads them, incrementally.

Each ``<tool_call>...</tool_call>`` block whose body is a JSON object with a string ``name``
(and an object ``arguments``, ``{}`` if left out) becomes a call; a block that is not stays in
the content as the model wrote it, and so does every other text, except whitespace next to a
call (the newlines around the blocks). A block still open when the reply ends counts if its
body parses (a reply cut at ``</tool_call>`` by a stop string), as vLLM's does; if it does not,
it is content too, unless a grammar kept the reply's calls well-formed (then it can only be a
call cut by max_tokens, which the finish_reason "length" says, and its text is dropped).

One parser serves a choice's stream and its whole reply alike (the whole text fed at once), so
the two give the same content and calls. Text that may be the start of ``<tool_call>`` is held
back until it is known not to be, and so is whitespace that may precede a call.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from router.tool_prompt import CALL_CLOSE, CALL_OPEN


@dataclass
class Parsed:
    """What a piece of the reply adds: content text and finished calls (OpenAI's shape)."""

    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)


class ToolCallParser:
    def __init__(self, max_calls: int | None = None, constrained: bool = False) -> None:
        self.max_calls = max_calls  # calls past it (parallel_tool_calls false) are dropped
        self.constrained = constrained  # a grammar checked the calls: a cut one is dropped
        self.num_calls = 0
        self._text = ""  # not yet read
        self._in_call = False  # after an opening tag whose closing one has not come
        self._held = ""  # whitespace that goes if a call follows

    def feed(self, text: str) -> Parsed:
        """The content and calls that ``text`` completes."""
        self._text += text
        out = Parsed()
        while self._step(out):
            pass
        return out

    def finish(self) -> Parsed:
        """The rest, at the end of the reply: held text, an unclosed block."""
        out = Parsed()
        rest, self._text = self._text, ""
        if self._in_call:
            self._in_call = False
            self._block(rest, out, closed=False)
        else:
            self._outside(rest, out)
        if not self.num_calls:
            out.content += self._held  # no call came: the reply is its text, every byte
        self._held = ""
        return out

    def _step(self, out: Parsed) -> bool:
        """Reads up to the next tag; False when the text read so far holds none."""
        if self._in_call:
            end = self._text.find(CALL_CLOSE)
            if end < 0:
                return False
            self._in_call = False
            self._block(self._text[:end], out, closed=True)
            self._text = self._text[end + len(CALL_CLOSE):]
            return True
        start = self._text.find(CALL_OPEN)
        if start < 0:
            keep = _partial_tag_len(self._text)
            self._outside(self._text[: len(self._text) - keep], out)
            self._text = self._text[len(self._text) - keep:]
            return False
        self._outside(self._text[:start], out)
        self._in_call = True
        self._text = self._text[start + len(CALL_OPEN):]
        return True

    def _outside(self, text: str, out: Parsed) -> None:
        """Text outside the blocks: content, but trailing whitespace waits on what follows."""
        self._held += text
        kept = self._held.rstrip()
        if kept:
            out.content += kept
            self._held = self._held[len(kept):]

    def _block(self, body: str, out: Parsed, closed: bool) -> None:
        call = _call(body)
        if call is None and not closed and self.constrained:
            return
        if call is None:
            self._outside(CALL_OPEN + body + (CALL_CLOSE if closed else ""), out)
            return
        self._held = ""  # the whitespace before a call is layout, not content
        if self.max_calls is None or self.num_calls < self.max_calls:
            out.calls.append({"index": self.num_calls, **call})
            self.num_calls += 1


def _call(body: str) -> dict[str, Any] | None:
    """OpenAI's tool call for a block's body, or None when it is not one."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    function = {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}
    return {"id": "call_" + secrets.token_hex(12), "type": "function", "function": function}


def _partial_tag_len(text: str) -> int:
    """How long a tail of ``text`` could still grow into ``<tool_call>``."""
    for size in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0
