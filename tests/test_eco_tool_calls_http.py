"""Tool calling over the HTTP chat API, driven by the official `openai` client against the live
stack (target + EAGLE drafter + router, the default model): a named tool_choice and `required`
give calls whose arguments follow their function's schema, speculation gives target-only's
call, the stream's tool_calls deltas (the arguments in pieces) add up to the whole reply's
call, `auto`'s calls to strict tools are well-formed wherever the model opens one, a tool result
continues the chat, and bad tools get a 400."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.helpers.eco_stack import EcoStack

pytestmark = pytest.mark.slow
MAX_TOKENS = 48  # a call to get_weather is about 35 tokens with SmolLM2's vocabulary
WEATHER_ARGS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}  # fmt: skip
TIME_ARGS = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
             "required": ["timezone"], "additionalProperties": False}  # fmt: skip
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} somewhere",
                                           "parameters": schema}}
         for name, schema in SCHEMAS.items()]  # fmt: skip
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
STRICT_TOOLS = [{**tool, "function": {**tool["function"], "strict": True}} for tool in TOOLS]
# Asked so, the default model opens a call under auto. Unchecked (without strict tools), its
# greedy reply was "Here's a response with the <tool_call>:\n\n```\nPython..." (a broken block
# left in content), and the first of 4 sampled ones (seed 3) opened a block with a broken body.
ASKS_FOR_A_CALL = [{"role": "user", "content": "Please check the weather in Rome with the "
                    "get_weather tool. Reply with the <tool_call>."}]  # fmt: skip


@pytest.fixture(scope="module")
def client(eco_stack: EcoStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="unused", max_retries=0,
                         timeout=120.0)  # fmt: skip


def ask(client: openai.OpenAI, eco: EcoStack, **options: Any) -> Any:
    return client.chat.completions.create(
        model=eco.model_name, messages=options.pop("messages", USER),
        tools=options.pop("tools", TOOLS),
        max_tokens=options.pop("max_tokens", MAX_TOKENS), **options,
    )  # fmt: skip


@pytest.fixture(scope="module")
def named(client: openai.OpenAI, eco_stack: EcoStack) -> Any:
    return ask(client, eco_stack, tool_choice=NAMED, temperature=0)


def check_call(call: Any, names: set[str]) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in names
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def test_named_choice_calls_that_function(named: Any) -> None:
    choice = named.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    check_call(call, {"get_weather"})


def test_speculation_gives_the_call_target_only_gives(
    client: openai.OpenAI, eco_stack: EcoStack, named: Any
) -> None:
    assert named.usage.model_extra["speculation"]["verify_steps"] > 0, "speculation did not run"
    alone = ask(client, eco_stack, tool_choice=NAMED, temperature=0,
                extra_body={"speculation": False})  # fmt: skip
    assert alone.choices[0].message.tool_calls[0].function == (
        named.choices[0].message.tool_calls[0].function
    )


def test_stream_deltas_add_up_to_the_same_call(
    client: openai.OpenAI, eco_stack: EcoStack, named: Any
) -> None:
    chunks = list(ask(client, eco_stack, tool_choice=NAMED, temperature=0, stream=True))
    content, calls, reasons, parts = "", {}, [], 0
    for chunk in chunks:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or ():
            parts += 1
            call = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "" and reasons[-1] == "tool_calls"
    whole = named.choices[0].message.tool_calls[0].function
    assert list(calls) == [0] and calls[0]["id"].startswith("call_")
    assert (calls[0]["name"], calls[0]["arguments"]) == (whole.name, whole.arguments)
    assert parts > 2, "the checked call's arguments should stream in pieces"


def test_required_calls_one_of_the_tools_in_each_choice(
    client: openai.OpenAI, eco_stack: EcoStack
) -> None:
    reply = ask(client, eco_stack, tool_choice="required", parallel_tool_calls=False, n=2,
                temperature=1.0, seed=7)  # fmt: skip
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls", choice
        [call] = choice.message.tool_calls
        check_call(call, set(SCHEMAS))


def test_strict_auto_calls_are_well_formed_and_speculation_keeps_them(
    client: openai.OpenAI, eco_stack: EcoStack
) -> None:
    unchecked = ask(client, eco_stack, messages=ASKS_FOR_A_CALL, max_tokens=64, temperature=0)
    assert "<tool_call>" in unchecked.choices[0].message.content  # what strict is for
    strict = {"messages": ASKS_FOR_A_CALL, "tools": STRICT_TOOLS}
    greedy = [ask(client, eco_stack, **strict, max_tokens=64, temperature=0,
                  parallel_tool_calls=False, extra_body={"speculation": speculate})
              for speculate in (True, False)]  # fmt: skip
    spec, alone = (reply.choices[0] for reply in greedy)
    assert spec.finish_reason == "tool_calls", spec  # one call, then the grammar ends the reply
    [call] = spec.message.tool_calls
    assert check_call(call, set(SCHEMAS)) == {"city": "Rome", "unit": "celsius"}
    assert (spec.message.content, call.function) == (alone.message.content,
                                                     alone.message.tool_calls[0].function)
    sampled = ask(client, eco_stack, **strict, n=4, temperature=1.0, seed=3, max_tokens=32)
    for choice in [spec, *sampled.choices]:
        assert "<tool_call>" not in (choice.message.content or ""), choice
        calls = list(choice.message.tool_calls or ())
        if choice.finish_reason == "length" and calls:  # max_tokens may have cut the last
            assert calls.pop().function.name in SCHEMAS
        for call in calls:
            check_call(call, set(SCHEMAS))


def test_a_tool_result_continues_the_chat(
    client: openai.OpenAI, eco_stack: EcoStack, named: Any
) -> None:
    call = named.choices[0].message.tool_calls[0]
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}
    asked = {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
    chat = [*USER, asked, result]
    status, tokens = eco_stack.post("/tokenize", {"messages": chat, "tools": TOOLS})
    assert status == 200, tokens
    _, prompt = eco_stack.post("/detokenize", {"tokens": tokens["tokens"]})
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in prompt["prompt"]
    assert call.function.arguments in prompt["prompt"]  # the call, as the model wrote it
    reply = ask(client, eco_stack, messages=chat, temperature=0, max_tokens=12)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("change", "param"),
    [({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
     ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
         "type": "object", "properties": {"a": {"type": "strin"}}}}}]},
      "tools[0].function.parameters"),
     ({"tool_choice": "required", "response_format": {"type": "json_object"}},
      "response_format")],
)  # fmt: skip
def test_bad_tools_are_400s_naming_the_parameter(
    eco_stack: EcoStack, change: dict, param: str
) -> None:
    status, body = eco_stack.post("/v1/chat/completions",
                                  {"messages": USER, "tools": TOOLS, **change})  # fmt: skip
    assert status == 400 and body["error"]["param"] == param, body
