"""The grammar that forces a reply to be tool calls (tool_choice required or a named function).

A Lark grammar for llguidance: each call is the whole Hermes block the prompt asks for
(router/tool_prompt.py), ``<tool_call>\\n{"name": "<name>", "arguments": <object>}\\n</tool_call>``,
with the name and the JSON around the arguments fixed text and the arguments an embedded
``%json`` of that function's own parameters schema. The arguments schema stays a document of its
own, so its ``$ref``s into its own ``$defs`` resolve as the client wrote them. Calls are joined
by a newline; after the last one only EOS is allowed, so the reply ends there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from router.tool_prompt import CALL_CLOSE, CALL_OPEN

CALL_HEAD = CALL_OPEN + '\n{"name": '  # then the name, the arguments, and CALL_TAIL
CALL_TAIL = "}\n" + CALL_CLOSE


def tool_grammar(functions: Sequence[tuple[str, dict[str, Any]]], many: bool) -> str:
    """A call to one of ``functions`` (name, parameters schema); ``many``: one or more."""
    lines = [
        'start: call ("\\n" call)*' if many else "start: call",
        f"call: {_literal(CALL_HEAD)} named {_literal(CALL_TAIL)}",
        "named: " + " | ".join(f"call_{i}" for i in range(len(functions))),
    ]
    for i, (name, parameters) in enumerate(functions):
        head = _literal(json.dumps(name) + ', "arguments": ')
        lines.append(f"call_{i}: {head} arguments_{i}")
        lines.append(f"arguments_{i}: %json {json.dumps(parameters)}")
    return "\n".join(lines) + "\n"


def _literal(text: str) -> str:
    """A Lark string literal (JSON's escaping; ensure_ascii keeps it on one line)."""
    return json.dumps(text)
