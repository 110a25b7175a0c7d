"""OpenAI chat messages turned into the router's ChatMessage, with a 400 naming what is wrong.

Besides role and content: an assistant message's ``tool_calls`` (its content may then be null)
and a ``tool`` message's ``tool_call_id``, so that a client can send a call's result back.
Any other key with a value is refused, as a body's is (body_keys.py): ``{"role": "user",
"contents": "hi"}`` used to be taken as an empty message.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from protos import generation_pb2 as pb
from router.json_text import parse_json
from router.openai_api.errors import ApiError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}  # fmt: skip
# A message's keys. ``name`` (a participant's name) and an assistant's ``refusal`` are taken
# and left out of the prompt: the default model's chat template has no place for either.
KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal")


def chat_message(message: Any, where: str) -> pb.ChatMessage:
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object with role and content", where)
    _refuse_unknown_keys(message, where)
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


def _refuse_unknown_keys(message: dict[str, Any], where: str) -> None:
    for key, value in message.items():
        if key in KEYS or value is None:  # null: absent, as clients send unset fields
            continue
        close = difflib.get_close_matches(str(key), KEYS, n=1, cutoff=0.75)
        meant = f"did you mean {close[0]}? " if close else ""
        raise ApiError(400, f"{where}: unrecognized key {key} ({meant}a message takes "
                       f"{', '.join(KEYS)})", f"{where}.{key}",
                       code="unrecognized_argument")  # fmt: skip
    for key in ("name", "refusal"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise ApiError(400, f"{where}.{key} must be a string", f"{where}.{key}")


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
