"""The OpenAI-compatible HTTP API, driven by the official `openai` client, against a live
stack (target + EAGLE drafter + router): output over HTTP is the gRPC API's output."""

from __future__ import annotations

import openai
import pytest

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack

pytestmark = pytest.mark.slow
MAX_TOKENS = 16
CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def client(eco_stack: EcoStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="unused", max_retries=0,
                         timeout=120.0)


def grpc_reply(eco: EcoStack, messages=None, text=None, **sampling) -> pb.GenerateResponse:
    request = pb.GenerateRequest()
    if messages is not None:
        for m in messages:
            request.messages.items.append(pb.ChatMessage(role=m["role"], content=m["content"]))
    else:
        request.text = text
    request.sampling.max_new_tokens = MAX_TOKENS
    request.sampling.temperature = 0.0
    for key, value in sampling.items():
        if key == "stop":
            request.sampling.stop.extend(value)
        else:
            setattr(request.sampling, key, value)
    stream = eco.router.generate(request)
    final = pb.GenerateResponse()
    final.CopyFrom(stream.final)
    final.text = stream.text
    return final


def test_models_lists_the_served_model(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [eco_stack.model_name]
    assert eco_stack.model_name == eco_stack.router.model_info().model_name


def test_models_retrieve_gives_the_listed_model(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    """The openai client's models.retrieve was a 404, for the served model too."""
    assert client.models.retrieve(eco_stack.model_name) == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError, match="gpt-4o"):
        client.models.retrieve("gpt-4o")


def test_chat_greedy_equals_grpc(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    reply = client.chat.completions.create(
        model=eco_stack.model_name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
    )
    expected = grpc_reply(eco_stack, messages=CHAT)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text and expected.text
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == expected.usage.completion_tokens == MAX_TOKENS
    assert reply.usage.prompt_tokens == expected.usage.prompt_tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + MAX_TOKENS
    spec = reply.usage.model_extra["speculation"]  # the extra usage field
    assert spec["verify_steps"] > 0 and spec["draft_tokens"] >= spec["accepted_tokens"]


def test_completion_greedy_equals_grpc(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    reply = client.completions.create(
        model=eco_stack.model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    )
    expected = grpc_reply(eco_stack, text=PROMPT)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == expected.text and expected.text
    assert reply.usage.completion_tokens == expected.usage.completion_tokens


def test_chat_stream_with_usage(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    chunks = list(client.chat.completions.create(
        model=eco_stack.model_name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0,
        stream=True, stream_options={"include_usage": True},
    ))
    expected = grpc_reply(eco_stack, messages=CHAT)
    *body, last = chunks
    assert last.choices == [] and last.usage is not None  # the usage chunk comes last
    assert last.usage.completion_tokens == expected.usage.completion_tokens == MAX_TOKENS
    assert last.usage.prompt_tokens == expected.usage.prompt_tokens
    assert all(c.usage is None for c in body)
    assert body[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in body)
    assert text == expected.text
    reasons = [c.choices[0].finish_reason for c in body]
    assert reasons[-1] == "length" and not any(reasons[:-1])
    assert len({c.id for c in chunks}) == 1 and last.object == "chat.completion.chunk"


def test_completion_stream_without_usage(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    chunks = list(client.completions.create(
        model=eco_stack.model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
        stream=True,
    ))
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked for
    assert "".join(c.choices[0].text for c in chunks) == grpc_reply(eco_stack, text=PROMPT).text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_seed_and_sampling_match_grpc(client: openai.OpenAI, eco_stack: EcoStack) -> None:
    sampled = dict(temperature=0.9, top_p=0.95, seed=1234)
    replies = [
        client.completions.create(
            model=eco_stack.model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, **sampled
        ).choices[0].text
        for _ in range(2)
    ]
    expected = grpc_reply(eco_stack, text=PROMPT, **sampled)
    assert replies[0] == replies[1] == expected.text  # same seed, same sample, either API
    greedy = grpc_reply(eco_stack, text=PROMPT).text
    stop = greedy.split()[2]  # a word inside the greedy reply
    reply = client.completions.create(
        model=eco_stack.model_name, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
        stop=[stop],
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == greedy[: greedy.index(stop)]
