"""OpenAI's logprobs shapes built from hand-made stream items, without a stack: the request
fields reach SamplingParams or get a 400 naming them; replies and stream chunks carry one entry
per token in chat's and the legacy completions' shape, offsets running on across chunks."""

from __future__ import annotations

import json
import math

import pytest

from protos import generation_pb2 as pb
from router.openai_api.echo import Echo
from router.openai_api.errors import ApiError
from router.openai_api.logprobs import LOGPROB_FLOOR, chat_logprobs, completion_logprobs
from router.openai_api.protocol import parse_chat, parse_completion
from router.openai_api.responses import Reply

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def token(text: str, logprob: float, token_id: int = 0) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=token_id, logprob=logprob, token=text, token_bytes=text.encode()
    )


def entry(text: str, logprob: float, *top: tuple[str, float]) -> pb.LogprobEntry:
    return pb.LogprobEntry(chosen=token(text, logprob), top=[token(t, lp) for t, lp in top])


def item(text: str, *entries: pb.LogprobEntry, finish: int = 0) -> pb.GenerateResponse:
    ids = list(range(len(entries)))
    return pb.GenerateResponse(
        text=text,
        token_ids=ids,
        logprobs=entries,
        finish_reason=finish,  # type: ignore[arg-type]
    )


def events(reply: Reply, *items: pb.GenerateResponse) -> list[dict]:
    out = []
    for i, one in enumerate(items):
        out += [json.loads(e.removeprefix("data: ")) for e in reply.chunks(one, i == 0)]
    return out


def test_chat_fields_reach_sampling_params() -> None:
    s = parse_chat({**CHAT, "logprobs": True, "top_logprobs": 20}).generate.sampling
    assert (s.logprobs, s.top_logprobs) == (True, 20)
    s = parse_chat({**CHAT, "logprobs": True}).generate.sampling
    assert (s.logprobs, s.top_logprobs) == (True, 0)
    s = parse_chat({**CHAT, "logprobs": False, "top_logprobs": None}).generate.sampling
    assert (s.logprobs, s.top_logprobs) == (False, 0)


@pytest.mark.parametrize("count", [0, 2, 20])
def test_completion_count_reaches_sampling_params(count: int) -> None:
    s = parse_completion({"prompt": "x", "logprobs": count}).generate.sampling
    assert (s.logprobs, s.top_logprobs) == (True, count)
    s = parse_completion({"prompt": "x", "logprobs": None}).generate.sampling
    assert (s.logprobs, s.top_logprobs) == (False, 0)


@pytest.mark.parametrize(
    ("chat", "extra", "param"),
    [
        (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (True, {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        (True, {"logprobs": True, "top_logprobs": 2.0}, "top_logprobs"),
        (True, {"logprobs": True, "top_logprobs": True}, "top_logprobs"),
        (True, {"top_logprobs": 3}, "top_logprobs"),
        (True, {"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
        (True, {"logprobs": 1}, "logprobs"),
        (True, {"logprobs": "true"}, "logprobs"),
        (False, {"logprobs": 21}, "logprobs"),
        (False, {"logprobs": -1}, "logprobs"),
        (False, {"logprobs": True}, "logprobs"),
        (False, {"logprobs": "2"}, "logprobs"),
    ],
)
def test_bad_logprobs_fields_name_themselves(chat: bool, extra: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        if chat:
            parse_chat({**CHAT, **extra})
        else:
            parse_completion({"prompt": "x", **extra})
    assert (caught.value.status, caught.value.param) == (400, param)


def test_chat_shape() -> None:
    shaped = chat_logprobs([entry("Hé", -0.25, ("Hé", -0.25), ("Ho", -2.0)), entry("!", -1.5)])
    first, second = shaped["content"]
    assert first == {
        "token": "Hé",
        "logprob": -0.25,
        "bytes": [72, 0xC3, 0xA9],
        "top_logprobs": [
            {"token": "Hé", "logprob": -0.25, "bytes": [72, 0xC3, 0xA9]},
            {"token": "Ho", "logprob": -2.0, "bytes": [72, 111]},
        ],
    }
    assert second["top_logprobs"] == []  # logprobs true, top_logprobs 0


def test_completion_shape_offsets_and_duplicate_strings() -> None:
    entries = [
        entry("The", -0.5, ("The", -0.5), ("A", -1.0)),
        entry(" sky", -math.inf, ("\ufffd", -0.75), ("\ufffd", -1.25)),
    ]
    shaped = completion_logprobs(entries, text_offset=7)
    assert shaped["tokens"] == ["The", " sky"]
    assert shaped["token_logprobs"] == [-0.5, LOGPROB_FLOOR]  # JSON has no -Infinity
    assert shaped["text_offset"] == [7, 10]
    assert shaped["top_logprobs"] == [{"The": -0.5, "A": -1.0}, {"\ufffd": -0.75}]
    assert completion_logprobs([entry("x", -1.0)], 0)["top_logprobs"] == [None]  # logprobs 0


def test_whole_reply_carries_logprobs_only_when_asked() -> None:
    merged = item("Hi!", entry("Hi", -0.5), entry("!", -0.25), finish=pb.FINISH_REASON_LENGTH)
    asked = Reply(chat=True, model="m", logprobs=True).whole(merged)["choices"][0]["logprobs"]
    assert [e["token"] for e in asked["content"]] == ["Hi", "!"]
    assert Reply(chat=True, model="m").whole(merged)["choices"][0]["logprobs"] is None
    legacy = Reply(chat=False, model="m", logprobs=True).whole(merged)["choices"][0]["logprobs"]
    assert legacy["text_offset"] == [0, 2] and legacy["token_logprobs"] == [-0.5, -0.25]


def test_completion_stream_offsets_run_on_across_chunks() -> None:
    reply = Reply(chat=False, model="m", logprobs=True)
    got = events(
        reply,
        item("The sky", entry("The", -0.5), entry(" sky", -0.25)),
        item(" is", entry(" is", -0.125), finish=pb.FINISH_REASON_LENGTH),
    )
    shaped = [c["choices"][0]["logprobs"] for c in got if c["choices"][0]["text"]]
    assert [s["text_offset"] for s in shaped] == [[0, 3], [7]]
    assert got[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_stream_sends_a_token_without_text() -> None:
    """An item whose token has no text yet (EOS, half a character) still sends its entry."""
    reply = Reply(chat=True, model="m", logprobs=True)
    eos = item("", entry("<|im_end|>", -0.0625), finish=pb.FINISH_REASON_EOS)
    got = events(reply, item("Hi", entry("Hi", -0.5)), eos)
    content = [c["choices"][0]["logprobs"] for c in got if c["choices"][0]["logprobs"]]
    assert [e["token"] for s in content for e in s["content"]] == ["Hi", "<|im_end|>"]
    assert [c["choices"][0]["delta"] for c in got] == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
        {"content": ""},
        {},
    ]
    plain = events(Reply(chat=True, model="m"), item("Hi", entry("Hi", -0.5)))
    assert all(c["choices"][0]["logprobs"] is None for c in plain)


def test_echo_fields_reach_sampling_params() -> None:
    scoring = parse_completion({"prompt": "a b", "echo": True, "logprobs": 1, "max_tokens": 0})
    assert scoring.echo and scoring.scores_only
    s = scoring.generate.sampling
    assert s.prompt_logprobs and s.logprobs and s.max_new_tokens == 1  # the reply drops it
    plain = parse_completion({"prompt": "a b", "echo": True, "max_tokens": 3})
    assert plain.echo and not plain.scores_only and not plain.generate.sampling.prompt_logprobs
    with pytest.raises(ApiError, match="max_tokens must be a positive integer"):
        parse_completion({"prompt": "a b", "max_tokens": 0})  # 0 only with echo


def test_a_scores_only_stream_sends_the_prompt_and_drops_the_sampled_token() -> None:
    reply = Reply(chat=False, model="m", logprobs=True, include_usage=True,
                  echo=Echo("Hi there", "Hi", scores_only=True))  # fmt: skip
    last = item("!", entry("!", -0.1), finish=pb.FINISH_REASON_EOS)
    last.prompt_logprobs.append(entry(" there", -2.0, (" there", -2.0)))
    last.usage.prompt_tokens, last.usage.completion_tokens = 2, 1
    chunks = events(reply, last)
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts == ["Hi there", ""]  # the prompt, then the finish: no "!"
    lp = chunks[0]["choices"][0]["logprobs"]
    assert lp == {"tokens": ["Hi", " there"], "token_logprobs": [None, -2.0],
                  "top_logprobs": [None, {" there": -2.0}], "text_offset": [0, 2]}  # fmt: skip
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert json.loads(reply.usage_chunk([reply.shown(last)]).removeprefix("data: "))["usage"][
        "completion_tokens"] == 0  # fmt: skip
