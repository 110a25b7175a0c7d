"""OpenAI's ``n`` over the HTTP API, driven by the official `openai` client against the live
stack: n choices, each its own request (choice i samples with seed + i, as a single request
with that seed does), the usage counting the prompt once, a stream interleaving the
choices' chunks, a client that goes away freeing every choice; a completions batch (a list of
prompts) gives n choices a prompt, in order. Bad n and bad batches get a 400."""

from __future__ import annotations

import time

import openai
import pytest

from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import router_tokenizer

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


def test_choice_i_draws_with_seed_plus_i(client, eco_stack: EcoStack) -> None:
    """Each choice begins as the single request with its seed does: later tokens may part, as
    batching 3 requests rounds floats otherwise than 1 (the stack is not --exact) and a draw
    near a boundary flips; target-only, as the switch may judge batch 3 otherwise than 1."""
    plain = dict(temperature=1.0, logprobs=True, extra_body={"speculation": False})
    reply = chat(client, eco_stack, n=N, seed=SEED, **plain)
    assert [c.index for c in reply.choices] == list(range(N))
    singles = [chat(client, eco_stack, seed=SEED + i, **plain) for i in range(N)]

    def head(choice) -> list[str]:
        return [t.token for t in choice.logprobs.content[:4]]

    assert [head(c) for c in reply.choices] == [head(s.choices[0]) for s in singles]
    assert len({c.message.content for c in reply.choices}) > 1, "n draws of one seed"
    assert reply.usage.prompt_tokens == singles[0].usage.prompt_tokens  # counted once
    tokens = sum(len(c.logprobs.content) for c in reply.choices)
    assert reply.usage.completion_tokens == tokens


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


def test_a_completions_batch_gives_n_choices_a_prompt_in_order(client, eco_stack) -> None:
    prompts = ["Once upon a time", "The sea is"]
    args = dict(model=eco_stack.model_name, max_tokens=6, temperature=0,
                extra_body={"ignore_eos": True})  # fmt: skip
    reply = client.completions.create(prompt=prompts, n=2, **args)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    singles = [client.completions.create(prompt=p, **args) for p in prompts]
    want = [singles[0].choices[0].text] * 2 + [singles[1].choices[0].text] * 2
    assert [c.text for c in reply.choices] == want
    assert reply.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert reply.usage.completion_tokens == 4 * 6
    ids = [router_tokenizer().encode(p) for p in prompts]  # the token-id form of a batch
    by_ids = client.completions.create(prompt=ids, **args)
    assert [c.text for c in by_ids.choices] == want[::2]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"prompt": ["a"] * 65}, "prompt"), ({"prompt": ["a", 5]}, "prompt"),
     ({"prompt": [[1, 2], []]}, "prompt"), ({"prompt": ["a"] * 5, "n": 60}, "n")],
)  # fmt: skip
def test_bad_batches_are_refused(eco_stack: EcoStack, body: dict, param: str) -> None:
    status, reply = eco_stack.post("/v1/completions", body)
    assert status == 400 and reply["error"]["param"] == param, reply


@pytest.mark.parametrize("n", [0, 65, "2", 1.5])
def test_bad_n_is_refused(eco_stack: EcoStack, n) -> None:
    status, body = eco_stack.post("/v1/chat/completions", {"messages": CHAT, "n": n})
    assert status == 400 and body["error"]["param"] == "n", body
