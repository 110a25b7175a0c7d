"""Tools in the prompt (router/tool_prompt.py, router/chat_template.py, router/chat_input.py):
a template that reads `tools` renders as transformers renders it; one that does not (the
default model's) gets the Hermes rewrite; chats without tools render as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from protos import generation_pb2 as pb
from router.admission import AdmissionLimits, check_fields
from router.chat_input import template_input
from router.chat_template import ChatTemplate
from router.errors import InvalidRequest
from router.tool_prompt import hermes_messages, tools_text

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}}  # fmt: skip
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}  # fmt: skip
CHAT: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
    {"role": "tool", "content": "18 C", "tool_call_id": "call_1"},
    {"role": "tool", "content": "24 C", "tool_call_id": "call_2"},
]
PLAIN = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
# A template in the style of Qwen2.5's, written for this test: tools in the system turn, calls
# and results in their own tags.
READS_TOOLS = (
    "{% if tools %}<sys>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</sys>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}]{% endfor %}"
    "{% if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_hermes_rewrite_puts_tools_calls_and_results_in_text() -> None:
    messages = hermes_messages(CHAT, [WEATHER])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == tools_text([WEATHER])
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in messages[0]["content"]
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert messages[2]["content"] == call + "\n" + call
    assert messages[3]["content"] == (
        "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n24 C\n</tool_response>"
    )


def test_hermes_rewrite_extends_a_system_message_and_keeps_content() -> None:
    chat = [{"role": "system", "content": "Be brief."}, *CHAT[:1],
            {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]}]  # fmt: skip
    messages = hermes_messages(chat, [WEATHER])
    assert messages[0]["content"] == "Be brief.\n\n" + tools_text([WEATHER])
    assert messages[2]["content"].startswith("Let me look.\n<tool_call>\n")
    assert hermes_messages(chat[:2], None) == chat[:2]  # no tools: no section


def test_a_template_that_ignores_tools_gets_the_rewrite() -> None:
    template = ChatTemplate(PLAIN, {})
    assert not template.reads_tools
    text = template.render(CHAT, add_generation_prompt=False, tools=[WEATHER])
    expected = "".join(f"<{m['role']}>{m['content']}\n" for m in hermes_messages(CHAT, [WEATHER]))
    assert text == expected
    chat = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"}]
    assert template.render(chat, False) == "<user>hi\n<tool>{}\n"  # no tools: as before


def test_a_template_that_reads_tools_renders_as_transformers_does() -> None:
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    template = ChatTemplate(READS_TOOLS, {})
    assert template.reads_tools
    for tools in ([WEATHER], None):
        ours = template.render(CHAT, add_generation_prompt=True, tools=tools)
        rendered, _ = render([CHAT], tools=tools, chat_template=READS_TOOLS,
                             add_generation_prompt=True)  # fmt: skip
        assert ours == rendered[0]
    assert "[call get_weather {\"city\": \"Paris\"}]" in ours


def test_template_input_parses_calls_and_tools() -> None:
    chat = pb.ChatMessages(tools=json.dumps([WEATHER]))
    chat.items.add(role="user", content="hi")
    chat.items.add(role="assistant").tool_calls.add(id="c", name="f", arguments='{"a": 1}')
    chat.items.add(role="tool", content="2", tool_call_id="c")
    messages, tools = template_input(chat)
    assert tools == [WEATHER]
    assert messages[1]["tool_calls"] == [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    ]
    assert messages[2] == {"role": "tool", "content": "2", "tool_call_id": "c"}
    assert template_input(pb.ChatMessages(items=[chat.items[0]])).tools is None


@pytest.mark.parametrize(
    ("tools", "arguments", "fragment"),
    [("[1]", "{}", "tools must be a JSON list"), ("{", "{}", "tools is not JSON"),
     ("", "[1]", "arguments must be a JSON object"), ("", "{", "arguments is not JSON"),
     # Python's json took these (or died of RecursionError): INVALID_ARGUMENT, not UNKNOWN.
     ("[" * 5000 + "]" * 5000, "{}", "tools is not JSON: nested too deeply"),
     ('[{"description": "\\ud800"}]', "{}", "tools is not JSON: .*lone UTF-16 surrogate"),
     ("", '{"a": ' * 5000 + "1" + "}" * 5000, "arguments is not JSON: nested too deeply")],
)  # fmt: skip
def test_template_input_says_what_does_not_parse(tools: str, arguments: str, fragment: str) -> None:
    chat = pb.ChatMessages(tools=tools)
    chat.items.add(role="assistant").tool_calls.add(name="f", arguments=arguments)
    with pytest.raises(ValueError, match=fragment):
        template_input(chat)


def test_admission_counts_tools_and_calls() -> None:
    request = pb.GenerateRequest()
    request.messages.tools = "x" * 40
    request.messages.items.add(role="user", content="hi").tool_calls.add(arguments="y" * 40)
    check_fields(request, AdmissionLimits(max_text_chars=100))
    with pytest.raises(InvalidRequest, match="characters"):
        check_fields(request, AdmissionLimits(max_text_chars=80))


def test_a_calls_arguments_come_back_as_the_text_they_were_sent_as() -> None:
    written = '{\n    "city": "Paris"\n}'  # as the model wrote it under the grammar
    call = pb.ToolCall(id="call_1", name="get_weather", arguments=written)
    chat = pb.ChatMessages(items=[pb.ChatMessage(role="user", content="Paris?"),
                                  pb.ChatMessage(role="assistant", tool_calls=[call])])  # fmt: skip
    parsed = template_input(chat)
    arguments = parsed.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert arguments == {"city": "Paris"}  # an object for templates, which tojson it
    rendered = ChatTemplate(READS_TOOLS, {}).render(parsed.messages, True)
    assert '[call get_weather {"city": "Paris"}]' in rendered
    [_, assistant] = hermes_messages(parsed.messages, None)
    block = '<tool_call>\n{"name": "get_weather", "arguments": ' + written + "}\n</tool_call>"
    assert assistant["content"] == block
