"""OpenAI request bodies turned into the router's own GenerateRequest.

Only what the server can honour is accepted; a parameter it cannot (suffix, chat's best_of > 1,
the legacy functions) is refused with a 400 naming the parameter, never ignored.
Values are then validated by the same code as the gRPC API (router.validation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from protos import generation_pb2 as pb
from router.json_text import parse_json
from router.openai_api.best_of import parse_best_of, refuse_in_chat
from router.openai_api.body_keys import refuse_unknown_keys
from router.openai_api.choices import MAX_CHOICES, MAX_REQUESTS, fan_out
from router.openai_api.errors import ApiError
from router.openai_api.formats import format_key
from router.openai_api.messages import chat_message
from router.openai_api.sampling import chat_logprobs, completion_logprobs, flag, sampling
from router.openai_api.tools import ToolRequest, apply_tools, parse_tools
from router.openai_api.values import is_int, is_int64


@dataclass(frozen=True)
class ParsedRequest:
    generate: pb.GenerateRequest
    model: str | None  # None: the body named none, so the served one
    stream: bool
    include_usage: bool
    n: int = 1  # choices, each a request of its own (router/openai_api/choices.py)
    # completions: one request per prompt of a batch, each fanned out to n (empty: generate)
    prompts: tuple[pb.GenerateRequest, ...] = ()
    echo: bool = False  # completions: the prompt leads the reply (router/openai_api/echo.py)
    scores_only: bool = False  # echo with max_tokens 0: the prompt alone, scored
    best_of: int = 0  # completions: candidates a prompt, the n best returned (0: n; best_of.py)
    hidden_logprobs: bool = False  # best_of ranks by logprobs that the client did not ask for
    tools: ToolRequest | None = None  # chat: the tools offered (router/openai_api/tools.py)
    # The body's keys for the request fields that the router's validation names otherwise
    # (InvalidRequest.field): a 400 it gives names the key the client sent as its ``param``.
    params: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_candidates(self) -> int:
        return max(self.n, self.best_of)


def requests(parsed: ParsedRequest) -> list[pb.GenerateRequest]:
    """Every candidate's request: prompt by prompt, n (or best_of) each (OpenAI's index order)."""
    bases = parsed.prompts or (parsed.generate,)
    return [one for base in bases for one in fan_out(base, parsed.num_candidates)]


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = parse_json(raw)
    except ValueError as err:
        raise ApiError(400, f"request body is not valid JSON: {err}", code="invalid_json") from err
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return body


def parse_chat(body: dict[str, Any]) -> ParsedRequest:
    refuse_unknown_keys(body, "chat completions")
    request = pb.GenerateRequest()
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        request.messages.items.append(chat_message(message, f"messages[{i}]"))
    _refuse_unsupported(body, chat=True)
    tools = parse_tools(body)
    chat_logprobs(request.sampling, body)
    parsed = _finish(request, body, max_tokens_keys=("max_completion_tokens", "max_tokens"))
    params = {**parsed.params, "input": "messages"}
    if tools is not None:
        tools = apply_tools(request, tools)  # after _finish: it checks the structured output set
        if tools.checked:  # the tools' grammar is the request's structured output
            params["structured_output"] = "tools"
    return replace(parsed, tools=tools, params=params)


def parse_completion(body: dict[str, Any]) -> ParsedRequest:
    refuse_unknown_keys(body, "completions")
    request = pb.GenerateRequest()
    prompts = _prompts(body.get("prompt"))
    _set_input(request, prompts[0])
    _refuse_unsupported(body, chat=False)
    completion_logprobs(request.sampling, body)
    echo = flag(body, "echo")
    request.sampling.prompt_logprobs = echo and request.sampling.logprobs
    scores_only = echo and is_int(body.get("max_tokens")) and body["max_tokens"] == 0
    if scores_only:  # the router samples a token after any prefill: the reply drops it
        body = {**body, "max_tokens": 1}
    parsed = _finish(request, body, max_tokens_keys=("max_tokens",))
    if len(prompts) * parsed.n > MAX_REQUESTS:
        raise ApiError(400, f"{len(prompts)} prompts x n {parsed.n} exceed {MAX_REQUESTS} "
                       "choices a request", "n")  # fmt: skip
    best_of = parse_best_of(body, parsed.n, parsed.stream, len(prompts))
    hidden_logprobs = best_of > parsed.n and not request.sampling.logprobs
    request.sampling.logprobs |= best_of > parsed.n  # after prompt_logprobs: echo's stay off
    batch = []
    for prompt in prompts:  # each with the first one's parameters
        one = pb.GenerateRequest()
        one.CopyFrom(request)
        one.ClearField("input")
        _set_input(one, prompt)
        batch.append(one)
    return replace(parsed, prompts=tuple(batch), echo=echo, scores_only=scores_only,
                   best_of=best_of, hidden_logprobs=hidden_logprobs,
                   params={**parsed.params, "input": "prompt"})  # fmt: skip


def _prompts(prompt: Any) -> list[str | list[int]]:
    """OpenAI's four forms: a string, a list of token ids, a list of strings or of lists of
    token ids (a batch: one prompt each)."""
    if isinstance(prompt, str) or _token_ids(prompt):
        return [prompt]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, str) or _token_ids(p) for p in prompt)
    ):
        if len(prompt) > MAX_CHOICES:
            raise ApiError(400, f"at most {MAX_CHOICES} prompts a request", "prompt")
        return prompt
    raise ApiError(400, "prompt must be a string, a list of token ids, or a list of either "
                   "(one prompt each)", "prompt")  # fmt: skip


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_int64(t) for t in value)


def _set_input(request: pb.GenerateRequest, prompt: str | list[int]) -> None:
    if isinstance(prompt, str):
        request.text = prompt
    else:
        request.input_ids.ids.extend(prompt)


def _refuse_unsupported(body: dict[str, Any], chat: bool) -> None:
    if chat:  # completions take it (router/openai_api/best_of.py)
        refuse_in_chat(body)
    if not chat:  # chat's are router/openai_api/tools.py's
        for key in ("tools", "functions"):
            if body.get(key):
                raise ApiError(400, f"{key} are a chat completions parameter", key)
    if not chat and body.get("suffix"):
        raise ApiError(400, "suffix is not supported", "suffix")


def _finish(
    request: pb.GenerateRequest, body: dict[str, Any], max_tokens_keys: tuple[str, ...]
) -> ParsedRequest:
    model = body.get("model")  # left out: the served model, as vLLM does
    if model is not None and (not isinstance(model, str) or not model):
        raise ApiError(400, "model must be the served model's name", "model")
    sampling(request.sampling, body, max_tokens_keys)
    speculation = body.get("speculation")
    if speculation is not None:
        if not isinstance(speculation, bool):
            raise ApiError(400, "speculation must be true or false", "speculation")
        request.speculation.enabled = speculation
    stream = flag(body, "stream")
    include_usage = _include_usage(body.get("stream_options"), stream)
    max_tokens = next((k for k in max_tokens_keys if body.get(k) is not None), max_tokens_keys[0])
    params = {"max_new_tokens": max_tokens, "structured_output": format_key(body)}
    return ParsedRequest(request, model, stream, include_usage, _choices(body), params=params)


# stream_options' keys. ``include_obfuscation`` (OpenAI's padding of stream events against
# length side channels) changes no token or text, so it is taken and ignored.
_STREAM_OPTIONS = {"include_usage", "include_obfuscation"}


def _include_usage(options: Any, stream: bool) -> bool:
    """stream_options' include_usage; any key that is not one of its own is refused, as a
    top-level one is (body_keys.py), so a misspelt include_usage is not silently off."""
    if options is None:
        return False
    if not stream:  # as OpenAI and vLLM answer it
        raise ApiError(400, "stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    for key, value in options.items():
        where = f"stream_options.{key}"
        if key not in _STREAM_OPTIONS:
            raise ApiError(400, f"unrecognized stream option: {key} (this server takes "
                           f"{', '.join(sorted(_STREAM_OPTIONS))})", where,
                           code="unrecognized_argument")  # fmt: skip
        if value is not None and not isinstance(value, bool):
            raise ApiError(400, f"{where} must be true or false", where)
    return bool(options.get("include_usage"))


def _choices(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}", "n")
    return n
