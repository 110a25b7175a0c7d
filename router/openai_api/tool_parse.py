"""Tool calls read out of a reply's text, as vLLM's Hermes parser reads them, incrementally.

Each ``<tool_call>...</tool_call>`` block whose body is a JSON object with a string ``name``
(and an object ``arguments``, ``{}`` if left out) becomes a call; a block that is not stays in
the content as the model wrote it, and so does every other text, except whitespace next to a
call (the newlines around the blocks). A block still open when the reply ends counts if its
body parses (a reply cut at ``</tool_call>`` by a stop string), as vLLM's does; if it does not,
it is content too. Such calls come whole, their arguments re-serialized, once the block closes.

Where a grammar kept the calls well-formed (``checked``), a call is read as it is written
(router/openai_api/call_stream.py): it starts once its header names the function, and its
arguments follow in pieces, as the model wrote them, as OpenAI streams them; a call that
max_tokens or a stop string cut keeps the arguments written so far (``cut``: the finish_reason
is then "length" or "stop", not "tool_calls").

One parser serves a choice's stream and its whole reply alike (the whole text fed at once), so
the two give the same content and calls. Text that may be the start of ``<tool_call>`` is held
back until it is known not to be, and so is whitespace that may precede a call.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from router.json_text import parse_json
from router.openai_api.call_stream import ObjectEnd, header
from router.openai_api.tool_grammar import CALL_TAIL
from router.tool_prompt import CALL_CLOSE, CALL_OPEN


@dataclass
class Parsed:
    """What a piece of the reply adds: content text, the calls it finished (whole, OpenAI's
    shape) and the stream's tool_calls deltas (whole calls, or a checked call's pieces)."""

    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    deltas: list[dict[str, Any]] = field(default_factory=list)

    def __add__(self, other: Parsed) -> Parsed:
        return Parsed(self.content + other.content, self.calls + other.calls,
                      self.deltas + other.deltas)  # fmt: skip


class ToolCallParser:
    def __init__(self, max_calls: int | None = None, checked: bool = False) -> None:
        self.max_calls = max_calls  # calls past it (parallel_tool_calls false) are dropped
        self.checked = checked  # a grammar kept the calls well-formed: they stream
        self.num_calls = 0
        self.cut = False  # the reply ended inside a checked call (max_tokens or a stop string)
        self._text = ""  # not yet read
        self._in_call = False  # after an opening tag whose call has not ended
        self._held = ""  # whitespace that goes if a call follows
        self._call: dict[str, Any] | None = None  # checked: the call being written
        self._arguments = ObjectEnd()  # checked: where its arguments end

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
        if self._in_call and self.checked:
            self.cut = True
            self._end_checked(out)  # kept with what it has, unless its name was not out
        elif self._in_call:
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
        if self._in_call and self.checked:
            return self._step_checked(out)
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
        if call is None:
            self._outside(CALL_OPEN + body + (CALL_CLOSE if closed else ""), out)
            return
        self._held = ""  # the whitespace before a call is layout, not content
        if self._room():
            call = {"index": self.num_calls, **call}
            out.calls.append(call)
            out.deltas.append(call)
            self.num_calls += 1

    # ---- checked calls: read as they are written ----------------------------------------------

    def _step_checked(self, out: Parsed) -> bool:
        """A checked call's next part: its header, arguments, then its end."""
        if self._call is None:
            found = header(self._text)
            if found is None:
                return False  # not whole yet: the grammar forces it
            self._start_checked(found[0], out)
            self._text = self._text[found[1]:]
        if not self._arguments.done:
            size = self._arguments.feed(self._text)
            self._add_arguments(self._text[:size], out)
            self._text = self._text[size:]
            if not self._arguments.done:
                return False
        if len(self._text) < len(CALL_TAIL):
            return False
        self._text = self._text[len(CALL_TAIL):]  # the grammar forces it
        self._end_checked(out)
        return True

    def _start_checked(self, name: str, out: Parsed) -> None:
        self._held = ""
        self._arguments = ObjectEnd()
        self._call = _new_call(name, "")
        if self._room():
            self._call["index"] = self.num_calls
            start = {**self._call, "function": dict(self._call["function"])}
            out.deltas.append(start)  # a copy: the call's arguments grow
            self.num_calls += 1

    def _add_arguments(self, text: str, out: Parsed) -> None:
        assert self._call is not None
        if text and "index" in self._call:
            self._call["function"]["arguments"] += text
            out.deltas.append({"index": self._call["index"], "function": {"arguments": text}})

    def _end_checked(self, out: Parsed) -> None:
        if self._call is not None and "index" in self._call:
            out.calls.append(self._call)
        self._in_call, self._call = False, None

    def _room(self) -> bool:
        return self.max_calls is None or self.num_calls < self.max_calls


def _call(body: str) -> dict[str, Any] | None:
    """OpenAI's tool call for a block's body, or None when it is not one."""
    try:
        value = parse_json(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    return _new_call(value["name"], json.dumps(arguments, ensure_ascii=False))


def _new_call(name: str, arguments: str) -> dict[str, Any]:
    function = {"name": name, "arguments": arguments}
    return {"id": "call_" + secrets.token_hex(12), "type": "function", "function": function}


def _partial_tag_len(text: str) -> int:
    """How long a tail of ``text`` could still grow into ``<tool_call>``."""
    for size in range(min(len(text), len(CALL_OPEN) - 1), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0
