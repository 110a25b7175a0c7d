"""Logprobs over the OpenAI HTTP API, driven by the official `openai` client against the live
stack: one entry per completion token in chat's and the legacy completions' shape, the same
entries streamed as whole, and the target's values whether the drafter ran or not."""

from __future__ import annotations

import openai
import pytest

from tests.helpers.eco_stack import EcoStack

pytestmark = pytest.mark.slow
MAX_TOKENS = 16
TOP = 3
CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three primary colours are"
# Streamed and whole, or speculative and target-only, the same token's logprob may come from
# another step's batch (fp32 on CPU: ~1e-5 apart).
ATOL = 1e-3


@pytest.fixture(scope="module")
def client(eco_stack: EcoStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=eco_stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=120.0
    )


def chat_args(eco: EcoStack, **extra) -> dict:
    return dict(
        model=eco.model_name,
        messages=CHAT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        top_logprobs=TOP,
        **extra,
    )


def completion_args(eco: EcoStack, **extra) -> dict:
    return dict(
        model=eco.model_name,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=2,
        **extra,
    )


def as_tuples(content) -> list[tuple]:
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in content]


def assert_close(got: list[tuple], want: list[tuple]) -> None:
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [g[1] for g in got] == pytest.approx([w[1] for w in want], abs=ATOL)
    for g, w in zip(got, want, strict=True):
        assert [t for t, _ in g[2]] == [t for t, _ in w[2]]
        assert [lp for _, lp in g[2]] == pytest.approx([lp for _, lp in w[2]], abs=ATOL)


def test_chat_logprobs_whole_and_streamed(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    reply = client.chat.completions.create(**chat_args(eco_stack))
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert choice.finish_reason == "length"  # no EOS entry: the tokens spell the text
    assert len(content) == reply.usage.completion_tokens == MAX_TOKENS
    assert "".join(e.token for e in content) == choice.message.content
    for e in content:
        assert e.bytes == list(e.token.encode())  # a plain ASCII reply
        top = [t.logprob for t in e.top_logprobs]
        assert len(top) == TOP and top == sorted(top, reverse=True)
        assert (e.token, e.logprob) == (e.top_logprobs[0].token, top[0])  # greedy: the argmax
        assert -30 < e.logprob <= 0

    chunks = list(client.chat.completions.create(**chat_args(eco_stack), stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert_close(as_tuples(streamed), as_tuples(content))


def test_completion_logprobs(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    reply = client.completions.create(**completion_args(eco_stack))
    text, lp = reply.choices[0].text, reply.choices[0].logprobs
    n = reply.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n == MAX_TOKENS
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(n)]
    for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2 and top[tok] == logprob == max(top.values())  # greedy

    chunks = list(client.completions.create(**completion_args(eco_stack), stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset  # offsets run on
    streamed = [x for p in parts for x in p.token_logprobs]
    assert streamed == pytest.approx(lp.token_logprobs, abs=ATOL)


def test_speculation_keeps_the_targets_logprobs(client: openai.OpenAI, eco_stack: EcoStack):
    replies = {
        on: client.chat.completions.create(**chat_args(eco_stack, extra_body={"speculation": on}))
        for on in (True, False)
    }
    spec = {on: r.usage.model_extra["speculation"] for on, r in replies.items()}
    assert spec[True]["verify_steps"] > 0 and spec[False] is None  # the drafter ran, then not
    on, off = (as_tuples(replies[k].choices[0].logprobs.content) for k in (True, False))
    assert_close(on, off)


def test_completion_count_out_of_range(eco_stack: EcoStack) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2, "logprobs": 21}
    status, reply = eco_stack.post("/v1/completions", body)
    assert status == 400 and reply["error"]["param"] == "logprobs", reply
