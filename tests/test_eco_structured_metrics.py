"""/metrics for structured output and tool calling, against the live stack: requests counted by
format kind, a format compiled once for two requests (one cache miss, one hit), a bad format
counted as refused, the forced-tokens counter equal to what the replies' usage says, and a
named tool call over HTTP counted by tool_choice with its call."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import openai
import pytest

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.test_eco_metrics import scrape

pytestmark = pytest.mark.slow
P = "splitspec:"
FORCING = r"Answer: (yes|no)\. Sure: [0-9]"  # its literal text is forced
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def request(text: str, speculate: bool = True, **fmt: Any) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.append(pb.ChatMessage(role="user", content=text))
    req.sampling.max_new_tokens = 24
    req.sampling.temperature = 0.0
    req.sampling.structured_output.CopyFrom(pb.StructuredOutput(**fmt))
    req.speculation.enabled = speculate
    return req


def measured(eco: EcoStack, workload: Callable[[], Any]) -> tuple[Any, Callable[..., float]]:
    """Runs ``workload`` between two scrapes of an idle router; returns its result and the
    delta of a sample, by metric name (less the prefix) and labels."""
    eco.router.wait_idle()
    before = scrape(eco)
    result = workload()
    eco.router.wait_idle()
    after = scrape(eco)

    def delta(name: str, **labels: str) -> float:
        key = P + name + (json.dumps(labels, sort_keys=True) if labels else "")
        return after.get(key, 0.0) - before.get(key, 0.0)

    return result, delta


def test_formats_counted_by_kind_compiled_once_and_refused(eco_stack: EcoStack) -> None:
    tag = "k" + uuid.uuid4().hex[:8]  # formats no other test sent: the cache cannot hold them
    schema = json.dumps({"type": "object", "properties": {tag: {"type": "integer"}},
                         "required": [tag], "additionalProperties": False})  # fmt: skip

    def workload() -> grpc.RpcError:
        for _ in range(2):
            eco_stack.router.generate(request("Give me a number as JSON.", json_schema=schema))
        eco_stack.router.generate(request("Count to three.", regex=tag + ": [0-9]{3}"))
        with pytest.raises(grpc.RpcError) as refused:
            eco_stack.router.generate(request("Anything.", regex="((" + tag))
        return refused.value

    refused, delta = measured(eco_stack, workload)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert delta("structured_output_requests_total", format="json_schema") == 2
    assert delta("structured_output_requests_total", format="regex") == 1  # not the refused one
    assert delta("structured_output_refused_total", format="regex") == 1
    assert delta("structured_output_refused_total", format="json_schema") == 0
    assert delta("structured_output_cache_queries_total") == 4
    assert delta("structured_output_cache_hits_total") == 1  # the schema's second request
    assert delta("structured_output_compile_seconds_count", format="json_schema") == 1
    assert delta("structured_output_compile_seconds_count", format="regex") == 2  # bad one too


def test_forced_tokens_counter_adds_up_the_replies_usage(eco_stack: EcoStack) -> None:
    """Speculative trees grown by the format's forced tokens, and target-only chains of them
    (router/forced_steps.py)."""
    text = "Is the sky blue? Say how sure you are, 0 to 9."
    streams, delta = measured(eco_stack, lambda: [
        eco_stack.router.generate(request(text, speculate, regex=FORCING))
        for speculate in (True, False)
    ])  # fmt: skip
    forced = [s.final.speculation.forced_tokens for s in streams]
    assert all(num > 0 for num in forced), forced
    assert delta("spec_decode_num_forced_tokens_total") == sum(forced)


def test_tool_requests_and_calls_counted(eco_stack: EcoStack) -> None:
    """A named call whole and streamed, and an ``auto`` request whose reply may call or not."""
    client = openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="unused",
                           max_retries=0, timeout=120.0)  # fmt: skip

    def ask(**options: Any) -> Any:
        return client.chat.completions.create(
            model=eco_stack.model_name, messages=USER, tools=TOOLS, max_tokens=48,
            temperature=0, **options,
        )  # fmt: skip

    def workload() -> list[int]:
        named = ask(tool_choice=NAMED).choices[0].message.tool_calls or []
        streamed = {call.index for chunk in ask(tool_choice=NAMED, stream=True)
                    for call in chunk.choices[0].delta.tool_calls or []}  # its arguments in pieces
        auto = ask().choices[0].message.tool_calls or []
        return [len(named), len(streamed), len(auto)]

    calls, delta = measured(eco_stack, workload)
    assert calls[:2] == [1, 1], calls
    assert delta("tool_call_requests_total", tool_choice="named") == 2
    assert delta("tool_call_requests_total", tool_choice="auto") == 1
    assert delta("tool_calls_total") == sum(calls)
    assert delta("structured_output_requests_total", format="grammar") == 2  # the named ones'
