"""logit_bias end to end (real target, EAGLE replica and router): with speculation on it gives
exactly what it gives with it off (greedy), a -100 bias bans a token and +100 all but forces
one, the output is the argmax of HF transformers' logits plus the bias at every position, the
reported logprobs stay the model's own, and bad maps are refused by both APIs."""

from __future__ import annotations

import grpc
import openai
import pytest
import torch

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import chat_ids
from tests.helpers.reference import HFReference

pytestmark = pytest.mark.slow
MAX_NEW = 20
TEXT = "Name three colours of the rainbow."
TIE_GAP = 1e-2  # fp32 kernels of two engines may swap near-tied tokens


def request(speculate: bool, bias: dict[int, float]) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.append(pb.ChatMessage(role="user", content=TEXT))
    req.sampling.max_new_tokens = MAX_NEW
    req.sampling.temperature = 0.0
    req.sampling.ignore_eos = True
    req.sampling.logprobs = True
    for token, value in bias.items():
        req.sampling.logit_bias[token] = value
    req.speculation.enabled = speculate
    return req


@pytest.fixture(scope="module")
def runs(eco_stack: EcoStack) -> dict:
    """The unbiased greedy reply, then with its 2nd and 5th tokens banned, each speculative
    and target-only."""
    plain = eco_stack.router.generate(request(False, {})).token_ids
    bias = {plain[1]: -100.0, plain[4]: -100.0}
    out = {"plain": plain, "bias": bias}
    for speculate in (True, False):
        out[speculate] = eco_stack.router.generate(request(speculate, bias))
    return out


def test_speculation_gives_what_target_only_gives(runs: dict) -> None:
    assert runs[True].token_ids == runs[False].token_ids
    assert runs[True].final.speculation.verify_steps > 0, "speculation did not run"


def test_banned_tokens_never_come_and_the_reply_changes(runs: dict) -> None:
    ids = runs[False].token_ids
    assert not set(runs["bias"]) & set(ids)
    assert ids[:1] == runs["plain"][:1] and ids != runs["plain"]


def test_output_is_the_argmax_of_the_biased_logits(runs: dict, hf: HFReference) -> None:
    prompt = list(chat_ids([{"role": "user", "content": TEXT}]))
    completion = runs[True].token_ids
    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    raw = torch.log_softmax(logits.float(), dim=-1)
    biased = logits.float().clone()
    for token, value in runs["bias"].items():
        biased[:, token] += value
    for k, token in enumerate(completion):
        assert float(biased[k, token]) >= float(biased[k].max()) - TIE_GAP, f"position {k}"
    reported = [e.chosen.logprob for item in runs[True].items for e in item.logprobs]
    want = raw[torch.arange(len(completion)), completion]
    torch.testing.assert_close(torch.tensor(reported), want, atol=2e-3, rtol=0)


def test_a_forced_token_comes_every_time(eco_stack: EcoStack) -> None:
    stream = eco_stack.router.generate(request(True, {42: 100.0}))
    assert stream.token_ids == [42] * MAX_NEW


@pytest.mark.parametrize(
    ("bias", "message"),
    [({10**9: 1.0}, "logit_bias token ids out of vocabulary"),
     ({5: 101.0}, "logit_bias values must be in [-100, 100]")],
)  # fmt: skip
def test_bad_maps_are_refused(eco_stack: EcoStack, bias: dict, message: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        eco_stack.router.generate(request(False, bias))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_http_takes_openais_shape(eco_stack: EcoStack, runs: dict) -> None:
    client = openai.OpenAI(base_url=eco_stack.base_url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model=eco_stack.model_name, messages=[{"role": "user", "content": TEXT}],
        max_tokens=MAX_NEW, temperature=0, logit_bias={str(t): v for t, v in runs["bias"].items()},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert reply.choices[0].message.content == runs[True].text
    for bad in ({"x": 1}, {"5": "high"}, [5]):
        status, body = eco_stack.post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "logit_bias": bad})  # fmt: skip
        assert status == 400 and body["error"]["param"] == "logit_bias", body
