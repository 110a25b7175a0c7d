"""Structured output in OpenAI bodies: OpenAI's ``response_format`` and vLLM's spellings,
turned into ``SamplingParams.structured_output`` (router/structured_output.py compiles it).

Accepted, one format a request:

- ``response_format``: ``{"type": "text"}`` (nothing), ``{"type": "json_object"}``, or
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`` (OpenAI's);
- vLLM's ``structured_outputs``: ``{"json": schema, "regex": ..., "choice": [...],
  "grammar": ..., "json_object": true}``, and its older ``guided_json``, ``guided_regex``,
  ``guided_choice``, ``guided_grammar``.
"""

from __future__ import annotations

import json
from typing import Any

from protos import generation_pb2 as pb
from router.json_text import parse_json
from router.openai_api.errors import ApiError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}  # fmt: skip


def set_format(s: pb.SamplingParams, body: dict[str, Any]) -> None:
    """Fills ``s.structured_output`` from whichever of the spellings the body uses."""
    asked = [(key, value) for key, value in _spellings(body) if value is not None]
    if len(asked) > 1:
        names = ", ".join(key for key, _ in asked)
        raise ApiError(400, f"one structured output format a request, got {names}", asked[1][0])
    if asked:
        key, (kind, value) = asked[0]
        _fill(s.structured_output, kind, value, key)


def format_key(body: dict[str, Any]) -> str:
    """The key of the body's structured output (response_format where it has none)."""
    asked = [key for key, _ in _spellings(body)]
    return asked[0] if asked else "response_format"


def _spellings(body: dict[str, Any]) -> list[tuple[str, Any]]:
    found = [("response_format", _response_format(body.get("response_format")))]
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise ApiError(400, "structured_outputs must be an object", "structured_outputs")
        for kind, value in outputs.items():
            if kind not in ("json", "regex", "choice", "grammar", "json_object"):
                raise ApiError(400, f"structured_outputs.{kind} is not supported",
                               "structured_outputs")  # fmt: skip
            found.append((f"structured_outputs.{kind}", (kind, value)))
    for key, kind in _GUIDED.items():
        if body.get(key) is not None:
            found.append((key, (kind, body[key])))
    return [(key, value) for key, value in found if value is not None and value[1] is not None]


def _response_format(fmt: Any) -> tuple[str, Any] | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json_object", True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ApiError(400, "response_format.json_schema needs a schema object",
                           "response_format")  # fmt: skip
        return ("json", spec["schema"])
    raise ApiError(400, "response_format.type must be text, json_object or json_schema",
                   "response_format")  # fmt: skip


def _fill(out: pb.StructuredOutput, kind: str, value: Any, key: str) -> None:
    if kind == "json":
        if isinstance(value, str):
            value = _json_text(value, key)
        if not isinstance(value, dict):
            raise ApiError(400, f"{key} must be a JSON Schema object", key)
        out.json_schema = json.dumps(value)
    elif kind == "json_object":
        if value is not True:
            raise ApiError(400, f"{key} must be true", key)
        out.json_object = True
    elif kind == "choice":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ApiError(400, f"{key} must be a list of strings", key)
        out.choice.values.extend(value)
    else:  # regex, grammar
        if not isinstance(value, str):
            raise ApiError(400, f"{key} must be a string", key)
        setattr(out, kind, value)


def _json_text(text: str, key: str) -> Any:
    try:
        return parse_json(text)
    except ValueError as err:
        raise ApiError(400, f"{key} is not JSON: {err}", key) from err
