"""OpenAI's ``n`` over the HTTP API, driven by the official `openai` client against the live
stack: n choices, each its own request (choice i samples with seed + i, so each equals a
single request with that seed), the usage counting the prompt once, a stream interleaving the
choices' chunks, a client that goes away freeing every choice. Bad n gets a 400."""

from __future__ import annotations

import time

import openai
import pytest

from tests.helpers.eco_stack import EcoStack

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Write a line about autumn."}]
MAX_TOKENS = 12
N = 3
SEED = 77


@pytest.fixture(scope="module")
def client(eco_stack: EcoStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=eco_stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=120.0
    )


def chat(client: openai.OpenAI, eco: EcoStack, **extra):
    return client.chat.completions.create(model=eco.model_name, messages=CHAT,
                                          max_tokens=MAX_TOKENS, **extra)  # fmt: skip


def test_choices_are_the_single_requests_of_their_seeds(client, eco_stack: EcoStack) -> None:
    reply = chat(client, eco_stack, n=N, temperature=1.0, seed=SEED)
    assert [c.index for c in reply.choices] == list(range(N))
    texts = [c.message.content for c in reply.choices]
    singles = [chat(client, eco_stack, temperature=1.0, seed=SEED + i) for i in range(N)]
    assert texts == [s.choices[0].message.content for s in singles]
    assert len(set(texts)) > 1, "n draws of one seed"
    assert reply.usage.prompt_tokens == singles[0].usage.prompt_tokens  # counted once
    assert reply.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_a_stream_interleaves_the_choices(client, eco_stack: EcoStack) -> None:
    whole = chat(client, eco_stack, n=N, temperature=1.0, seed=SEED)
    chunks = list(chat(client, eco_stack, n=N, temperature=1.0, seed=SEED, stream=True,
                       stream_options={"include_usage": True}))  # fmt: skip
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    texts, finishes = [""] * N, [0] * N
    for c in body:
        (choice,) = c.choices
        texts[choice.index] += choice.delta.content or ""
        finishes[choice.index] += choice.finish_reason is not None
    assert texts == [c.message.content for c in whole.choices]
    assert finishes == [1] * N and len({c.id for c in chunks}) == 1


def test_a_client_that_goes_away_frees_every_choice(client, eco_stack: EcoStack) -> None:
    stream = client.completions.create(model=eco_stack.model_name, prompt="Once upon a time",
                                       max_tokens=2000, n=N, stream=True,
                                       extra_body={"ignore_eos": True})  # fmt: skip
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 30
    while eco_stack.router.status().num_running and time.monotonic() < deadline:
        time.sleep(0.2)
    status = eco_stack.router.status()
    assert status.num_running == 0 and status.num_waiting == 0


@pytest.mark.parametrize("n", [0, 65, "2", 1.5])
def test_bad_n_is_refused(eco_stack: EcoStack, n) -> None:
    status, body = eco_stack.post("/v1/chat/completions", {"messages": CHAT, "n": n})
    assert status == 400 and body["error"]["param"] == "n", body
