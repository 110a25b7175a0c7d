"""Reading tool calls out of a reply (router/openai_api/tool_parse.py) and the reply shapes
(router/openai_api/responses.py): the whole text and any split of it into stream pieces give the
same content and calls, markup never reaches the content, and finish_reason says tool_calls;
grammar-checked calls stream their arguments in pieces that add up to the whole reply's call."""

from __future__ import annotations

import json

import pytest

from protos import generation_pb2 as pb
from router.openai_api.responses import Reply
from router.openai_api.tool_parse import Parsed, ToolCallParser

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>{"name": "get_time"}</tool_call>'


def parse(text: str, pieces: int = 1, **options) -> Parsed:
    """The parser's output for ``text`` fed in ``pieces`` (about) equal parts, then finished."""
    parser = ToolCallParser(**options)
    out = Parsed()
    size = max(1, -(-len(text) // pieces))
    for start in range(0, len(text), size):
        out += parser.feed(text[start:start + size])
    return out + parser.finish()


def shapes(parsed: Parsed) -> tuple[str, list[tuple[int, str, dict]]]:
    calls = [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"]))
             for c in parsed.calls]  # fmt: skip
    return parsed.content, calls


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("Just text.\n", "Just text.\n", []),
        ("ends <tool", "ends <tool", []),  # held back in case it was a tag, then let go
        (CALL, "", [(0, "get_weather", {"city": "Paris"})]),
        ("Let me check.\n" + CALL + "\n" + TIME + "\n",
         "Let me check.", [(0, "get_weather", {"city": "Paris"}), (1, "get_time", {})]),
        ("<tool_call>not json</tool_call>\n" + CALL,
         "<tool_call>not json</tool_call>", [(0, "get_weather", {"city": "Paris"})]),
        (CALL + "\nThen more.", "\nThen more.", [(0, "get_weather", {"city": "Paris"})]),
        ('<tool_call>\n{"name": "f", "arguments": {}}', "", [(0, "f", {})]),  # cut by a stop
        ("<tool_call>\n{\"name\": \"f\", \"argu", "<tool_call>\n{\"name\": \"f\", \"argu", []),
        ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
         []),
    ],
)  # fmt: skip
def test_calls_and_content(text: str, content: str, calls: list) -> None:
    for pieces in (1, 3, len(text)):  # whole, a few chunks, a character at a time
        assert shapes(parse(text, pieces)) == (content, calls), pieces


def test_each_call_has_its_own_id_and_openais_shape() -> None:
    parsed = parse(CALL + CALL)
    first, second = parsed.calls
    assert first["id"].startswith("call_") and first["id"] != second["id"]
    assert first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_max_calls_drops_the_rest_and_checked_drops_a_call_cut_in_its_header() -> None:
    assert len(parse(CALL + CALL + CALL, max_calls=1).calls) == 1
    assert len(parse(CALL + "\n" + CALL, max_calls=1, checked=True).calls) == 1
    cut = CALL + "\n" + CALL[:30]  # cut before the name is whole
    assert shapes(parse(cut, checked=True)) == ("", [(0, "get_weather", {"city": "Paris"})])
    assert parse(cut).content == "\n" + CALL[:30]  # free text: the model's own words stay


def stream_calls(parsed: Parsed) -> dict[int, dict[str, str]]:
    """The stream's tool_calls deltas joined by index, as the openai client joins them."""
    joined: dict[int, dict[str, str]] = {}
    for delta in parsed.deltas:
        call = joined.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
        call["id"] += delta.get("id", "")
        call["name"] += delta.get("function", {}).get("name", "")
        call["arguments"] += delta.get("function", {}).get("arguments", "")
    return joined


def whole_calls(parsed: Parsed) -> dict[int, dict[str, str]]:
    return {c["index"]: {"id": c["id"], **c["function"]} for c in parsed.calls}


def test_checked_calls_stream_their_arguments_as_written() -> None:
    spaced = CALL.replace('{"city": "Paris"}', '{ "city" :"Par\\"is</tool_call>" }')
    text = "Let me look.\n" + spaced + "\n" + CALL
    whole = parse(text, checked=True)
    assert whole.content == "Let me look."
    assert [c["function"]["arguments"] for c in whole.calls] == [
        '{ "city" :"Par\\"is</tool_call>" }', '{"city": "Paris"}']  # the model's own text
    for pieces in (3, 40, len(text)):
        streamed = parse(text, pieces, checked=True)
        assert streamed.content == whole.content
        assert len(streamed.deltas) > len(streamed.calls)  # the arguments came in pieces
        assert stream_calls(streamed) == whole_calls(streamed)
        starts = [d for d in streamed.deltas if "id" in d]
        assert [d["function"] for d in starts] == [{"name": "get_weather", "arguments": ""}] * 2


def test_a_checked_call_cut_after_its_name_keeps_what_it_has() -> None:
    cut = CALL[: CALL.index("Paris")]
    parsed = parse(cut, 5, checked=True)
    [call] = parsed.calls
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "'}
    assert stream_calls(parsed) == whole_calls(parsed)


def item(text: str, finish: int = pb.FINISH_REASON_UNSPECIFIED) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, finish_reason=finish)


def test_whole_reply_has_tool_calls_and_null_content() -> None:
    reply = Reply(chat=True, model="m", tool_parser=ToolCallParser())
    choice = reply.whole(item(CALL, pb.FINISH_REASON_EOS))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert set(call) == {"id", "type", "function"}  # index is the stream's alone
    plain = Reply(chat=True, model="m", tool_parser=ToolCallParser())
    choice = plain.whole(item("No call.", pb.FINISH_REASON_EOS))["choices"][0]
    assert choice == {**choice, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "No call."}}  # fmt: skip


def test_stream_chunks_carry_content_then_whole_calls() -> None:
    reply = Reply(chat=True, model="m", tool_parser=ToolCallParser())
    pieces = ["Sure.\n<tool", "_call>\n{\"name\": \"f\", ", '"arguments": {"a": 1}}\n</tool_call>']
    events = [e for i, p in enumerate(pieces) for e in reply.chunks(item(p), first=i == 0)]
    events += reply.chunks(item("", pb.FINISH_REASON_EOS), first=False)
    choices = [json.loads(e[len("data: "):])["choices"][0] for e in events]
    deltas = [c["delta"] for c in choices]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "Sure."
    [call] = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert call["index"] == 0 and call["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_a_cut_reply_stays_length() -> None:
    reply = Reply(chat=True, model="m", tool_parser=ToolCallParser())
    choice = reply.whole(item(CALL + CALL[:20], pb.FINISH_REASON_LENGTH))["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["message"]["tool_calls"]) == 1


def test_checked_stream_chunks_add_up_to_the_whole_reply() -> None:
    text = "Sure.\n" + CALL
    whole = Reply(chat=True, model="m", tool_parser=ToolCallParser(checked=True)).whole(
        item(text, pb.FINISH_REASON_EOS))["choices"][0]["message"]  # fmt: skip
    reply = Reply(chat=True, model="m", tool_parser=ToolCallParser(checked=True))
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    events = [e for i, p in enumerate(pieces) for e in reply.chunks(item(p), first=i == 0)]
    events += reply.chunks(item("", pb.FINISH_REASON_EOS), first=False)
    choices = [json.loads(e[len("data: "):])["choices"][0] for e in events]
    parts = [part for c in choices for part in c["delta"].get("tool_calls", ())]
    assert len(parts) > 2 and parts[0]["function"] == {"name": "get_weather", "arguments": ""}
    arguments = "".join(part["function"].get("arguments", "") for part in parts)
    assert arguments == whole["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert "".join(c["delta"].get("content", "") for c in choices) == whole["content"] == "Sure."
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_a_stop_string_inside_a_checked_call_is_stop_not_tool_calls() -> None:
    cut = Reply(chat=True, model="m", tool_parser=ToolCallParser(checked=True))
    choice = cut.whole(item(CALL[: CALL.index("Paris")], pb.FINISH_REASON_STOP))["choices"][0]
    assert choice["finish_reason"] == "stop" and len(choice["message"]["tool_calls"]) == 1
    whole = Reply(chat=True, model="m", tool_parser=ToolCallParser(checked=True))
    choice = whole.whole(item(CALL, pb.FINISH_REASON_EOS))["choices"][0]
    assert choice["finish_reason"] == "tool_calls"


def test_a_block_nested_past_pythons_json_limit_is_content_not_a_crash() -> None:
    block = "<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>"  # RecursionError in json
    assert shapes(parse(block)) == (block, [])
