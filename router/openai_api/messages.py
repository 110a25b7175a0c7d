"""OpenAI chat messages turned into the router's ChatMessage, with a 400 naming what is wrong.

Besides role and content: an assistant message's ``tool_calls`` (its content may then be null)
and a ``tool`` message's ``tool_call_id``, so that a client can send a call's result back.
"""

from __future__ import annotations

import json
from typing import Any

from protos import generation_pb2 as pb
from router.json_text import parse_json
from router.openai_api.errors import ApiError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}  # fmt: skip


def chat_message(message: Any, where: str) -> pb.ChatMessage:
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object with role and content", where)
    role_name = message.get("role")
    # Checked for a str first: a list or an object as role is unhashable in the lookup.
    role = ROLES.get(role_name) if isinstance(role_name, str) else None
    if role is None:
        raise ApiError(400, f"{where}.role must be one of {sorted(ROLES)}", f"{where}.role")
    out = pb.ChatMessage(role=role, content=_content(message.get("content"), where))
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise ApiError(400, f"{where}.tool_calls must be a list, on an assistant message",
                           f"{where}.tool_calls")  # fmt: skip
        out.tool_calls.extend(_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls))
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise ApiError(400, f"{where}.tool_call_id must name the call this result answers",
                           f"{where}.tool_call_id")  # fmt: skip
        out.tool_call_id = call_id
    return out


def _call(call: Any, where: str) -> pb.ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise ApiError(400, f"{where} must be {{\"type\": \"function\", \"function\": "
                       "{\"name\", \"arguments\"}}", where)  # fmt: skip
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise ApiError(400, f"{where}.function.name must be a non-empty string",
                       f"{where}.function.name")  # fmt: skip
    text = arguments if isinstance(arguments, str) else None  # kept as sent (chat_input.py)
    if isinstance(arguments, str):
        arguments = _object(arguments)
    if not isinstance(arguments, dict):
        raise ApiError(400, f"{where}.function.arguments must be a JSON object, as a string",
                       f"{where}.function.arguments")  # fmt: skip
    call_id = call.get("id")
    return pb.ToolCall(id=call_id if isinstance(call_id, str) else "", name=name,
                       arguments=text or json.dumps(arguments, ensure_ascii=False))  # fmt: skip


def _object(text: str) -> Any:
    try:
        return parse_json(text)
    except ValueError:
        return None  # the caller's 400 names the field


def _content(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ApiError(400, f"{where}.content: only text parts are supported",
                               f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts",
                   f"{where}.content")
