"""A grammar-checked tool call read as it is written, so that its arguments stream in pieces.

Where a grammar keeps the calls well-formed (router/openai_api/tool_grammar.py), a block's
opening is fixed text, ``\\n{"name": "<name>", "arguments": ``, and its end is the arguments
object's closing brace followed by ``}\\n</tool_call>``. So the name is known as soon as the
header is whole, every character after it up to the object's end is arguments text, and the
object's end is found by counting brackets outside strings: a ``</tool_call>`` inside an argument
string does not end the call, as it would for a parser that looks for the closing tag.
"""

from __future__ import annotations

import re

from router.openai_api.tool_grammar import ARGUMENTS_KEY, CALL_HEAD

# The header the grammar forces after <tool_call>: the name is one of the tools' (OpenAI's rule
# for a name, so json.dumps writes it as it is).
HEADER = re.compile(re.escape(CALL_HEAD) + r'"([A-Za-z0-9_-]{1,64})"' + re.escape(ARGUMENTS_KEY))


def header(text: str) -> tuple[str, int] | None:
    """The called function's name and the header's length, once ``text`` holds it whole."""
    found = HEADER.match(text)
    return None if found is None else (found.group(1), found.end())


class ObjectEnd:
    """Finds where a JSON object ends in text fed piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def feed(self, text: str) -> int:
        """How much of ``text`` is still the object's (all of it, until its end is seen)."""
        for i, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)
