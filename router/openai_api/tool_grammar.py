"""The grammars that keep a reply's tool calls well-formed: calls only (tool_choice required or a
named function), or free text that may end in calls (``auto``).

Lark grammars for llguidance: each call is the whole Hermes block the prompt asks for
(router/tool_prompt.py), ``<tool_call>\\n{"name": "<name>", "arguments": <object>}\\n</tool_call>``,
with the name and the JSON around the arguments fixed text and the arguments an embedded
``%json`` of that function's own parameters schema. The arguments schema stays a document of its
own, so its ``$ref``s into its own ``$defs`` resolve as the client wrote them. Calls are joined
by a newline; after the last one only EOS is allowed, so the reply ends there.

``auto`` leaves the text free: it is one lexeme of any text without ``<tool_call>`` in it, or one
that ends at the first ``<tool_call>``, after which the rest is a call's. The opening tag belongs
to the text's lexeme because llguidance's lexer does not backtrack: a free text lexeme followed
by a separate ``<tool_call>`` one could not tell, at ``<tool_call``, which it was reading.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from router.tool_prompt import CALL_CLOSE, CALL_OPEN

CALL_HEAD = '\n{"name": '  # after CALL_OPEN; then the name, ARGUMENTS_KEY, the arguments
ARGUMENTS_KEY = ', "arguments": '
CALL_TAIL = "}\n" + CALL_CLOSE
# auto's text: with no opening tag at all (a reply without calls), or up to the first one.
_ANY = "(?s:.*)"
_TAG = json.dumps(CALL_OPEN)[1:-1]  # regex-safe: letters, _, < and >
TEXT_ONLY = f"/{_ANY}/ & ~/{_ANY}{_TAG}{_ANY}/"
TEXT_THEN_CALL = f"/{_ANY}{_TAG}/ & ~/{_ANY}{_TAG}(?s:.+)/"


def tool_grammar(
    functions: Sequence[tuple[str, dict[str, Any]]], many: bool, text_first: bool = False
) -> str:
    """A call to one of ``functions`` (name, parameters schema); ``many``: one or more;
    ``text_first`` (auto): free text first, the calls optional."""
    more = ' ("\\n" call)*' if many else ""
    if text_first:
        head = [f"start: TEXT_ONLY | TEXT_THEN_CALL body{more}",
                f"TEXT_ONLY: {TEXT_ONLY}", f"TEXT_THEN_CALL: {TEXT_THEN_CALL}"]  # fmt: skip
    else:
        head = [f"start: call{more}"]
    lines = [
        *head,
        f"call: {_literal(CALL_OPEN)} body",
        f"body: {_literal(CALL_HEAD)} named {_literal(CALL_TAIL)}",
        "named: " + " | ".join(f"call_{i}" for i in range(len(functions))),
    ]
    for i, (name, parameters) in enumerate(functions):
        head_text = _literal(json.dumps(name) + ARGUMENTS_KEY)
        lines.append(f"call_{i}: {head_text} arguments_{i}")
        lines.append(f"arguments_{i}: %json {json.dumps(parameters)}")
    return "\n".join(lines) + "\n"


def _literal(text: str) -> str:
    """A Lark string literal (JSON's escaping; ensure_ascii keeps it on one line)."""
    return json.dumps(text)
