"""Presence/frequency penalties end to end: with speculation on they give exactly what they give
with it off (greedy, several prompts), they change the output, and the output is what OpenAI's
definition gives on a reference model (HF transformers on the same weights)."""

from __future__ import annotations

import openai
import pytest

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.reference import HFReference

pytestmark = pytest.mark.slow
MAX_NEW = 24
PRESENCE, FREQUENCY = 0.8, 0.6
PROMPTS = [
    "Repeat the word hello five times.",
    "Count from one to ten in words.",
    "Write a short poem about the sea and the sea again.",
]
TIE_GAP = 1e-2  # fp32 kernels of two engines may swap near-tied tokens


def request(text: str, speculate: bool, presence: float, frequency: float) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.append(pb.ChatMessage(role="user", content=text))
    req.sampling.max_new_tokens = MAX_NEW
    req.sampling.temperature = 0.0
    if presence or frequency:
        req.sampling.presence_penalty = presence
        req.sampling.frequency_penalty = frequency
    req.speculation.enabled = speculate
    return req


@pytest.fixture(scope="module")
def outputs(eco_stack: EcoStack) -> dict:
    """(prompt, speculate, penalised) -> the final item and token ids."""
    out = {}
    runs = [(True, True), (False, True), (False, False)]  # (speculate, penalised)
    for text in PROMPTS:
        for speculate, penalised in runs:
            args = (PRESENCE, FREQUENCY) if penalised else (0.0, 0.0)
            stream = eco_stack.router.generate(request(text, speculate, *args))
            out[text, speculate, penalised] = (stream.final, stream.token_ids, stream.text)
    return out


def test_speculation_gives_what_target_only_gives(outputs: dict) -> None:
    for text in PROMPTS:
        spec_final, spec_ids, _ = outputs[text, True, True]
        _, base_ids, _ = outputs[text, False, True]
        assert spec_ids == base_ids, text
        assert spec_final.speculation.verify_steps > 0, "speculation did not run"


def test_penalties_change_the_output(outputs: dict) -> None:
    changed = [t for t in PROMPTS if outputs[t, False, True][1] != outputs[t, False, False][1]]
    assert changed, "the penalties changed no reply"


def test_output_follows_the_openai_definition(outputs: dict, hf: HFReference) -> None:
    import torch

    from tests.helpers.prompts import chat_ids

    text = PROMPTS[0]
    prompt = list(chat_ids([{"role": "user", "content": text}]))
    completion = outputs[text, True, True][1]
    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 :]
    counts = torch.zeros(logits.shape[-1])
    for k, token in enumerate(completion):
        step = logits[k] - FREQUENCY * counts - PRESENCE * (counts > 0).float()
        best = float(step.max())
        assert float(step[token]) >= best - TIE_GAP, f"position {k}: {token} is not the argmax"
        counts[token] += 1


def test_http_penalties_equal_grpc(eco_stack: EcoStack, outputs: dict) -> None:
    client = openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="x", max_retries=0)
    text = PROMPTS[1]
    reply = client.chat.completions.create(
        model=eco_stack.model_name, messages=[{"role": "user", "content": text}],
        max_tokens=MAX_NEW, temperature=0, presence_penalty=PRESENCE, frequency_penalty=FREQUENCY,
    )
    _, ids, grpc_text = outputs[text, True, True]
    assert reply.usage.completion_tokens == len(ids)
    assert reply.choices[0].message.content == grpc_text
