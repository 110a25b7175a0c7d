"""Tool calling for chat templates that know nothing of tools, in the Hermes format.

A template that reads `tools` renders the tool definitions, the assistant's `tool_calls` and
the `tool` results itself. Many do not (the default model's, SmolLM2's, prints role and content
and nothing else), so for those the router rewrites the chat into plain role/content messages
first, in the format Hermes-2-Pro and Qwen2.5 are trained on and that the HTTP API parses back
(router/openai_api/tool_parse.py):

- the definitions go into the system message (one is added first when the chat has none), one
  JSON object a line inside ``<tools></tools>``, with the instruction to answer a call as
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- an assistant message's calls are appended to its content, one such block each, their
  arguments the JSON text the client sent (router/chat_input.py keeps it);
- a run of `tool` results becomes one `user` message of ``<tool_response>`` blocks (as Qwen2.5's
  template does: many templates refuse any role but system, user and assistant).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_INSTRUCTIONS = """# Tools

You may call one or more functions to answer the user. The functions are described, one JSON \
object a line, within <tools></tools>:
<tools>
{tools}
</tools>

To call a function, reply with its name and arguments as a JSON object within \
<tool_call></tool_call>, one block for each call:
<tool_call>
{{"name": <function name>, "arguments": <arguments as a JSON object>}}
</tool_call>"""


def uses_tools(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> bool:
    """Whether the chat involves tools: definitions given, or a call or result among its
    messages (a `tool` message without a call id is left to the template, as before tools)."""
    return bool(tools) or any(m.get("tool_calls") or m.get("tool_call_id") for m in messages)


def hermes_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None
) -> list[dict[str, str]]:
    """The chat as plain role/content messages, the tools and calls written in as text."""
    plain: list[dict[str, str]] = []
    after_result = False  # the results of one turn's calls share one message
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if after_result:
                plain[-1]["content"] += "\n" + block
            else:
                plain.append({"role": "user", "content": block})
            after_result = True
            continue
        after_result = False
        calls = [call_text(c["function"]) for c in message.get("tool_calls") or ()]
        plain.append({"role": role, "content": "\n".join([content, *calls] if content else calls)})
    return _with_tools(plain, tools) if tools else plain


def call_text(function: Mapping[str, Any]) -> str:
    """One call as the model is asked to write it (arguments a JSON object, not its text), its
    arguments as their JSON text was sent where it was kept (router/chat_input.py)."""
    arguments = function["arguments"]
    text = getattr(arguments, "text", None) or json.dumps(arguments, ensure_ascii=False)
    name = json.dumps(function["name"], ensure_ascii=False)
    return f'{CALL_OPEN}\n{{"name": {name}, "arguments": {text}}}\n{CALL_CLOSE}'


def tools_text(tools: Sequence[Any]) -> str:
    """The system message's tool section."""
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return _INSTRUCTIONS.format(tools=lines)


def _with_tools(messages: list[dict[str, str]], tools: Sequence[Any]) -> list[dict[str, str]]:
    section = tools_text(tools)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        content = f"{first['content']}\n\n{section}" if first["content"] else section
        return [{"role": "system", "content": content}, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]
