"""A request's ChatMessages as a chat template reads them: transformers' message dicts and tools.

Calls' arguments travel as JSON text (as OpenAI sends them) but templates read them as objects
(`tool_call.arguments | tojson`), so they are parsed here, as vLLM does before rendering. The
object keeps its text, which the Hermes prompt (router/tool_prompt.py) writes back as it was: a
call the model made then reads in the next turn's prompt exactly as the model wrote it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from protos import generation_pb2 as pb
from router.json_text import parse_json


class Arguments(dict[str, Any]):
    """A call's arguments as templates read them, with the JSON text they came as."""

    def __init__(self, value: dict[str, Any], text: str) -> None:
        super().__init__(value)
        self.text = text


class TemplateInput(NamedTuple):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # None: the chat declares no tools


def template_input(chat: pb.ChatMessages) -> TemplateInput:
    """The chat's messages and tools; ValueError naming what does not parse."""
    messages = [_message(m, i) for i, m in enumerate(chat.items)]
    return TemplateInput(messages, _tools(chat.tools) if chat.tools else None)


def _message(message: pb.ChatMessage, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [_call(call, f"message {index} tool call {j}")
                             for j, call in enumerate(message.tool_calls)]  # fmt: skip
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def _call(call: pb.ToolCall, where: str) -> dict[str, Any]:
    arguments = _json(call.arguments or "{}", f"{where} arguments")
    if not isinstance(arguments, dict):
        raise ValueError(f"{where} arguments must be a JSON object")
    function = {"name": call.name, "arguments": Arguments(arguments, call.arguments or "{}")}
    return {"id": call.id, "type": "function", "function": function}


def _tools(text: str) -> list[dict[str, Any]]:
    tools = _json(text, "tools")
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be a JSON list of objects")
    return tools


def _json(text: str, what: str) -> Any:
    try:
        return parse_json(text)
    except ValueError as err:
        raise ValueError(f"{what} is not JSON: {err}") from err
