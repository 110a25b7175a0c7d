"""Chat requests with tools (router/openai_api/tools.py, messages.py, tool_grammar.py) without a
stack: each tool_choice puts the right tools and constraint in the router's request, bad input
gets a 400 naming the parameter, and the constraint accepts exactly the calls it should (the
grammar compiled by llguidance against the default model's vocabulary)."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest

from model_runtime.loading import default_model_path
from router.openai_api.errors import ApiError
from router.openai_api.protocol import parse_chat
from router.openai_api.tool_grammar import tool_grammar
from router.structured_output import _ll_tokenizer
from router.tokenizer import Tokenizer

CITY = {
    "type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
    "additionalProperties": False, "$defs": {"city": {"type": "string", "maxLength": 9}},
}  # fmt: skip
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Now"}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def chat(**body: Any) -> Any:
    return parse_chat({"messages": USER, "tools": [WEATHER, TIME], **body})


STRICT = {"type": "function", "function": {**WEATHER["function"], "strict": True}}


def test_auto_offers_the_tools_and_leaves_the_reply_free() -> None:
    parsed = chat()
    assert parsed.tools is not None and parsed.tools.choice == "auto"
    assert json.loads(parsed.generate.messages.tools) == [
        WEATHER, {"type": "function", "function": {"name": "get_time", "description": "Now"}}]
    assert parsed.generate.sampling.structured_output.WhichOneof("format") is None
    assert not parsed.tools.checked and parsed.tools.parser() is not None


def test_auto_with_a_strict_tool_checks_the_calls_only() -> None:
    parsed = parse_chat({"messages": USER, "tools": [STRICT, TIME]})
    assert json.loads(parsed.generate.messages.tools)[0] == WEATHER  # strict is not shown
    grammar = parsed.generate.sampling.structured_output.grammar
    assert grammar.startswith('start: TEXT_ONLY | TEXT_THEN_CALL body ("\\n" call)*')
    assert "get_time" in grammar and parsed.tools is not None and parsed.tools.checked


def test_auto_leaves_a_response_format_or_ignore_eos_alone() -> None:
    def chat(**body: Any) -> Any:
        return parse_chat({"messages": USER, "tools": [STRICT, TIME], **body})

    formatted = chat(response_format={"type": "json_object"})
    assert formatted.generate.sampling.structured_output.json_object
    assert formatted.tools is not None and not formatted.tools.checked
    endless = chat(ignore_eos=True)
    assert endless.generate.sampling.structured_output.WhichOneof("format") is None
    assert endless.tools is not None and not endless.tools.checked
    required = chat(tool_choice="required", ignore_eos=True)  # the router refuses it
    assert required.generate.sampling.structured_output.grammar


def test_none_offers_nothing_and_reads_nothing() -> None:
    parsed = chat(tool_choice="none")
    assert parsed.generate.messages.tools == ""
    assert parsed.tools is not None and parsed.tools.parser() is None


def test_named_and_required_constrain_to_calls() -> None:
    named = chat(tool_choice={"type": "function", "function": {"name": "get_time"}})
    grammar = named.generate.sampling.structured_output.grammar
    assert '"\\"get_time\\"' in grammar and "get_weather" not in grammar
    assert grammar.startswith("start: call\n")  # exactly one call
    required = chat(tool_choice="required").generate.sampling.structured_output.grammar
    assert "get_time" in required and "get_weather" in required
    assert required.startswith('start: call ("\\n" call)*')
    single = chat(tool_choice="required", parallel_tool_calls=False)
    assert single.generate.sampling.structured_output.grammar.startswith("start: call\n")


def test_assistant_calls_and_tool_results_reach_the_request() -> None:
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "9 C"}]}]
    items = parse_chat({"messages": messages, "tools": [WEATHER]}).generate.messages.items
    assert items[1].content == "" and items[1].tool_calls[0].name == "get_weather"
    assert json.loads(items[1].tool_calls[0].arguments) == {"city": "Paris"}
    assert (items[2].role, items[2].content, items[2].tool_call_id) == ("tool", "9 C", "call_1")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
         "tools[0].function.strict"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "string"}}}]}, "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "strin"}}}}}]},
         "tools[0].function.parameters"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"messages": [{"role": "tool", "content": "1"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": "a", "tool_calls": []}]},
         "messages[0].tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "f", "arguments": "[1]"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_parameter(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        chat(**body)
    assert err.value.status == 400 and err.value.param == param, err.value.message


@pytest.fixture(scope="module")
def vocabulary() -> Any:
    return _ll_tokenizer(Tokenizer.from_model_path(str(default_model_path())))


def accepts(vocabulary: Any, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(vocabulary, llguidance.grammar_from("grammar", grammar))
    assert not matcher.is_error(), matcher.get_error()
    tokens = vocabulary.tokenize_str(text)
    return matcher.try_consume_tokens(tokens) == len(tokens) and matcher.is_accepting()


def test_the_grammar_takes_exactly_calls_that_follow_their_schemas(vocabulary: Any) -> None:
    functions = [("get_weather", CITY), ("get_time", {"type": "object", "properties": {},
                                                      "additionalProperties": False})]  # fmt: skip
    many, one = tool_grammar(functions, many=True), tool_grammar(functions[:1], many=False)
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    now = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert accepts(vocabulary, many, weather) and accepts(vocabulary, one, weather)
    assert accepts(vocabulary, many, weather + "\n" + now)
    assert not accepts(vocabulary, one, weather + "\n" + weather)  # one call, then EOS
    assert not accepts(vocabulary, one, now)  # not the named function
    assert not accepts(vocabulary, many, weather.replace("Paris", "Paris, France"))  # maxLength
    assert not accepts(vocabulary, many, now.replace("{}", '{"x": 1}'))
    assert not accepts(vocabulary, many, "Sure! " + weather)


def test_auto_grammar_frees_the_text_and_checks_the_calls(vocabulary: Any) -> None:
    functions = [("get_weather", CITY)]
    many = tool_grammar(functions, many=True, text_first=True)
    one = tool_grammar(functions, many=False, text_first=True)
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for grammar in (many, one):
        assert accepts(vocabulary, grammar, "It is sunny. A <tool_call is just text.")
        assert accepts(vocabulary, grammar, "")
        assert accepts(vocabulary, grammar, weather)
        assert accepts(vocabulary, grammar, "Let me look.\n" + weather)
        assert not accepts(vocabulary, grammar, "Let me look. <tool_call>{broken")
        assert not accepts(vocabulary, grammar, weather.replace("get_weather", "get_time"))
        assert not accepts(vocabulary, grammar, weather + " Done.")  # calls end the reply
    assert accepts(vocabulary, many, weather + "\n" + weather)
    assert not accepts(vocabulary, one, weather + "\n" + weather)

