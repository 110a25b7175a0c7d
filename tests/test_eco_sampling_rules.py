"""min_p, repetition_penalty and min_tokens end to end (real target, EAGLE replica and router):
with speculation on each gives what it gives with it off (greedy), repetition_penalty's reply is
HF transformers' generate(repetition_penalty=...), min_tokens holds off EOS and a stop string,
min_p 1 makes hot sampling greedy, and the HTTP API takes them as vLLM's extras."""

from __future__ import annotations

import grpc
import openai
import pytest
import torch

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import chat_ids
from tests.helpers.reference import EOS_ID, HFReference

pytestmark = pytest.mark.slow
MAX_NEW = 24
REPEAT = "Repeat the word hello five times."
SHORT = "Is the sky blue? Answer with one word."
REPETITION = 1.3


def request(text: str, speculate: bool, **sampling) -> pb.GenerateRequest:
    req = pb.GenerateRequest(sampling=pb.SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0))
    req.messages.items.append(pb.ChatMessage(role="user", content=text))
    for key, value in sampling.items():
        if key == "stop":
            req.sampling.stop.extend(value)
        else:
            setattr(req.sampling, key, value)
    req.speculation.enabled = speculate
    return req


def both(eco_stack: EcoStack, text: str, **sampling) -> tuple:
    """The speculative and the target-only stream of one request."""
    return tuple(eco_stack.router.generate(request(text, s, **sampling)) for s in (True, False))


def test_repetition_penalty_is_hf_generates_and_speculation_keeps_it(
    eco_stack: EcoStack, hf: HFReference
) -> None:
    spec, base = both(eco_stack, REPEAT, repetition_penalty=REPETITION, ignore_eos=True)
    assert spec.token_ids == base.token_ids
    assert spec.final.speculation.verify_steps > 0, "speculation did not run"
    plain = eco_stack.router.generate(request(REPEAT, False, ignore_eos=True)).token_ids
    assert plain != base.token_ids, "the penalty changed nothing"
    prompt = torch.tensor([list(chat_ids([{"role": "user", "content": REPEAT}]))])
    with torch.inference_mode():
        out = hf.model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=MAX_NEW,
            do_sample=False, repetition_penalty=REPETITION, pad_token_id=EOS_ID, eos_token_id=None,
        )  # fmt: skip
    assert base.token_ids == out[0, prompt.shape[1] :].tolist()


def test_min_tokens_holds_off_eos_and_stop_strings(eco_stack: EcoStack) -> None:
    plain = eco_stack.router.generate(request(SHORT, False))
    assert plain.final.finish_reason == pb.FINISH_REASON_EOS and len(plain.token_ids) < 8
    min_tokens = len(plain.token_ids) + 6
    spec, base = both(eco_stack, SHORT, min_tokens=min_tokens)
    assert spec.token_ids == base.token_ids
    assert len(base.token_ids) >= min_tokens and EOS_ID not in base.token_ids[:min_tokens]
    assert spec.final.speculation.verify_steps > 0, "speculation did not run"
    stop = plain.text.strip()[:3]  # met in the first tokens: only min_tokens lets it pass
    early = eco_stack.router.generate(request(SHORT, True, stop=[stop]))
    assert early.final.finish_reason == pb.FINISH_REASON_STOP and len(early.token_ids) < 4
    held = eco_stack.router.generate(request(SHORT, True, stop=[stop], min_tokens=min_tokens))
    assert len(held.token_ids) >= min_tokens and held.text.startswith(plain.text.strip()[:3])


def test_min_p_one_makes_hot_sampling_greedy(eco_stack: EcoStack) -> None:
    greedy = eco_stack.router.generate(request(REPEAT, False, ignore_eos=True)).token_ids
    hot = dict(temperature=1.5, seed=7, min_p=1.0, ignore_eos=True)
    spec, base = both(eco_stack, REPEAT, **hot)
    assert spec.token_ids == base.token_ids == greedy
    loose = eco_stack.router.generate(request(REPEAT, False, **{**hot, "min_p": 0.0}))
    assert loose.token_ids != greedy, "the test is too weak"


@pytest.mark.parametrize(
    ("sampling", "field"),
    [({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
     ({"repetition_penalty": 2.5}, "repetition_penalty"),
     ({"min_tokens": MAX_NEW + 1}, "min_tokens")],
)  # fmt: skip
def test_bad_values_are_refused(eco_stack: EcoStack, sampling: dict, field: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        eco_stack.router.generate(request(SHORT, False, **sampling))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


def test_http_takes_them_as_vllm_extras(eco_stack: EcoStack) -> None:
    client = openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="x", max_retries=0)
    want = eco_stack.router.generate(
        request(REPEAT, True, repetition_penalty=REPETITION, min_tokens=MAX_NEW, min_p=0.1)
    )
    reply = client.chat.completions.create(
        model=eco_stack.model_name, messages=[{"role": "user", "content": REPEAT}],
        max_tokens=MAX_NEW, temperature=0,
        extra_body={"repetition_penalty": REPETITION, "min_tokens": MAX_NEW, "min_p": 0.1},
    )  # fmt: skip
    assert reply.choices[0].message.content == want.text
    assert reply.usage.completion_tokens == MAX_NEW
