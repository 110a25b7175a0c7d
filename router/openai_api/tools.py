"""OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, validated (a 400 names the
parameter) and applied to the router's request.

- ``none``: no tool is offered (the definitions stay out of the prompt, as vLLM's
  ``--exclude-tools-when-tool-choice-none`` does) and the reply is not parsed; earlier calls and
  results in the chat are still shown to the model.
- ``auto`` (the default with tools): the model decides; its reply is parsed for calls
  (router/openai_api/tool_parse.py). Where a tool sets OpenAI's ``strict: true``, the text stays
  free but a call the reply opens must be well-formed (tool_grammar.py): the name one of the
  tools', the arguments that tool's schema, and only more calls or the end after it. A small
  model that would have written a broken call writes a valid one instead; a reply that calls
  nothing is unchanged. It is opt-in because a masked position costs the GPU target its
  multi-step decode graphs (docs/api.md has the figures). With a ``response_format`` beside
  ``auto`` the format constrains the reply instead, and with ``ignore_eos`` (a grammar ends at
  EOS) nothing does; the calls are then only parsed.
- ``required`` and a named function: the reply is constrained to calls (tool_grammar.py), one or
  more (``required`` with ``parallel_tool_calls``) or exactly one, each with its function's own
  arguments schema.

Every constraint here is exact under speculation, as every structured output is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

import llguidance

from protos import generation_pb2 as pb
from router.openai_api.errors import ApiError
from router.openai_api.tool_grammar import tool_grammar
from router.openai_api.tool_parse import ToolCallParser

MAX_TOOLS = 128  # OpenAI's limit
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict[str, Any]  # a JSON Schema for the arguments object
    definition: dict[str, Any]  # as the prompt shows it: {"type": "function", "function": ...}
    strict: bool = False  # OpenAI's opt-in to calls that follow the schema (auto: checked)


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...]
    choice: str  # "none", "auto", "required", or "function" (named: ``function``)
    function: str | None = None
    parallel: bool = True
    checked: bool = False  # a grammar keeps the reply's calls well-formed (set by apply_tools)

    @property
    def constrained(self) -> bool:
        """The reply must be calls (``required``, a named function)."""
        return self.choice in ("required", "function")

    @property
    def strict(self) -> bool:
        """A tool asks for its calls to be checked (OpenAI's ``strict``)."""
        return any(tool.strict for tool in self.tools)

    @property
    def choice_label(self) -> str:
        """The choice as /metrics labels it: ``auto``, ``required``, ``named`` or ``none``."""
        return "named" if self.choice == "function" else self.choice

    @property
    def max_calls(self) -> int | None:
        """Calls a reply may make (None: any number)."""
        return None if self.parallel and self.choice != "function" else 1

    def parser(self) -> ToolCallParser | None:
        """A new reader of a reply's calls (None: ``none``, whose replies are all content)."""
        if self.choice == "none":
            return None
        return ToolCallParser(self.max_calls, self.checked)


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools and choice; None when it offers none."""
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise ApiError(400, f"{legacy} is deprecated and not supported: use tools and "
                           "tool_choice", legacy)  # fmt: skip
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise ApiError(400, f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    tools = tuple(_tool(tool, f"tools[{i}]") for i, tool in enumerate(raw))
    names = [tool.name for tool in tools]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ApiError(400, f"tools: function names must be unique, {duplicated} repeat", "tools")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", "parallel_tool_calls")
    kind, function = _choice(choice, names)
    return ToolRequest(tools, kind, function, parallel is not False)


def apply_tools(request: pb.GenerateRequest, tools: ToolRequest) -> ToolRequest:
    """Puts the definitions in the chat (unless ``none``) and the constraint in sampling; the
    tools as applied (``checked`` when a grammar keeps the calls well-formed)."""
    s = request.sampling
    formatted = s.structured_output.WhichOneof("format") is not None
    if tools.constrained and formatted:
        raise ApiError(400, "response_format (or another structured output) cannot be "
                       "combined with tool_choice required or a named function",
                       "response_format")  # fmt: skip
    if tools.choice == "none":
        return tools
    request.messages.tools = json.dumps([t.definition for t in tools.tools], ensure_ascii=False)
    if not tools.constrained and (not tools.strict or formatted or s.ignore_eos):
        return tools  # auto: unchecked unless strict, and a response_format or ignore_eos win
    offered = [t for t in tools.tools if tools.function in (None, t.name)]
    calls = [(t.name, t.parameters) for t in offered]
    s.structured_output.grammar = tool_grammar(
        calls, many=tools.max_calls is None, text_first=not tools.constrained
    )
    return replace(tools, checked=True)


def _tool(tool: Any, where: str) -> Tool:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ApiError(400, f'{where}.type must be "function"', f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ApiError(400, f"{where}.function must be an object", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ApiError(400, f"{where}.function.name must be 1 to 64 letters, digits, _ or -, "
                       f"got {name!r}", f"{where}.function.name")  # fmt: skip
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ApiError(400, f"{where}.function.description must be a string",
                       f"{where}.function.description")  # fmt: skip
    parameters = _parameters(function.get("parameters"), f"{where}.function.parameters")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, f"{where}.function.strict must be true or false",
                       f"{where}.function.strict")  # fmt: skip
    shown: dict[str, Any] = {"name": name}
    if description:
        shown["description"] = description
    if "parameters" in function:
        shown["parameters"] = parameters
    return Tool(name, parameters, {"type": "function", "function": shown}, strict is True)


def _parameters(schema: Any, where: str) -> dict[str, Any]:
    """The arguments' JSON Schema: an object schema that llguidance compiles (left out: a
    function without arguments, ``{}``)."""
    if schema is None:
        return NO_PARAMETERS
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ApiError(400, f'{where} must be a JSON Schema of "type": "object"', where)
    error = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_json_schema(schema)
    )
    if error:
        raise ApiError(400, f"{where} is not a JSON Schema the server can follow: {error}", where)
    return schema


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if choice in ("none", "auto", "required"):
        return choice, None
    name = _named(choice)
    if name is None:
        raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": '
                       '"function", "function": {"name": ...}}', "tool_choice")  # fmt: skip
    if name not in names:
        raise ApiError(400, f"tool_choice names {name!r}, which is not among tools {names}",
                       "tool_choice")  # fmt: skip
    return "function", name


def _named(choice: Any) -> str | None:
    """The function a ``{"type": "function", "function": {"name": ...}}`` choice names."""
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None
