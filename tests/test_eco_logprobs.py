"""Logprobs through the public gRPC API, end to end (real target, EAGLE replica and router).

Every committed token carries its log-probability under the target model's own distribution:
HF transformers' log-softmax over the same weights at the same position, with speculation on
(the drafter proposes, the target's verify commits) as with it off, greedy and sampled (the
raw distribution, not the temperature's), one entry per token however the stream's items are
cut and wherever a stop string cuts a block. Bad requests are refused before they run.
"""

from __future__ import annotations

import grpc
import pytest
import torch

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import chat_ids
from tests.helpers.reference import HFReference
from tests.helpers.rpc import Stream

pytestmark = pytest.mark.slow
MAX_NEW = 20
TOP = 4
PROMPTS = ["Name three colours of the rainbow.", "Write a haiku about rain."]
# fp32 kernels of two engines (measured 2e-5 apart in tests/test_logprobs_engine.py); the
# speculative and target-only runs differ only in which step computed a row.
ATOL = 2e-3


def request(text: str, speculate: bool, temperature: float = 0.0) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.append(pb.ChatMessage(role="user", content=text))
    req.sampling.max_new_tokens = MAX_NEW
    req.sampling.temperature = temperature
    req.sampling.seed = 11
    req.sampling.logprobs = True
    req.sampling.top_logprobs = TOP
    req.speculation.enabled = speculate
    return req


def entries(stream: Stream) -> list[pb.LogprobEntry]:
    for item in stream.items:
        assert len(item.logprobs) == len(item.token_ids), "an item's logprobs and tokens differ"
    return [e for item in stream.items for e in item.logprobs]


def chosen(stream: Stream) -> torch.Tensor:
    return torch.tensor([e.chosen.logprob for e in entries(stream)])


def hf_logprobs(hf: HFReference, text: str, completion: list[int]) -> torch.Tensor:
    """HF's log-softmax at each completion token's position, of that token."""
    prompt = list(chat_ids([{"role": "user", "content": text}]))
    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt + completion[:-1]])).logits[0, len(prompt) - 1 :]
    table = torch.log_softmax(logits.float(), dim=-1)
    return table[torch.arange(len(completion)), torch.tensor(completion)]


@pytest.fixture(scope="module")
def greedy_runs(eco_stack: EcoStack) -> dict[tuple[str, bool], Stream]:
    runs = [(text, speculate) for text in PROMPTS for speculate in (True, False)]
    return {run: eco_stack.router.generate(request(*run)) for run in runs}


def test_speculation_reports_the_target_only_values(greedy_runs) -> None:
    for text in PROMPTS:
        spec, base = greedy_runs[text, True], greedy_runs[text, False]
        assert spec.final.speculation.verify_steps > 0, "speculation did not run"
        assert base.final.speculation.verify_steps == 0
        assert spec.token_ids == base.token_ids
        torch.testing.assert_close(chosen(spec), chosen(base), atol=ATOL, rtol=0)
        spec_top = [[t.token_id for t in e.top] for e in entries(spec)]
        assert spec_top == [[t.token_id for t in e.top] for e in entries(base)]


def test_values_are_the_target_models_distribution(greedy_runs, hf: HFReference) -> None:
    for text in PROMPTS:
        stream = greedy_runs[text, True]
        expected = hf_logprobs(hf, text, stream.token_ids)
        torch.testing.assert_close(chosen(stream), expected, atol=ATOL, rtol=0)


def test_top_lists_and_spelling(greedy_runs, eco_stack: EcoStack) -> None:
    eos = set(eco_stack.router.model_info().eos_token_ids)
    for (text, _), stream in greedy_runs.items():
        spelled = b""
        for token, entry in zip(stream.token_ids, entries(stream), strict=True):
            assert entry.chosen.token_id == token
            tops = [t.logprob for t in entry.top]
            assert len(tops) == TOP and tops == sorted(tops, reverse=True)
            # Greedy: the chosen token is the most likely one.
            assert entry.top[0].token_id == token and entry.top[0].logprob == entry.chosen.logprob
            if token not in eos:  # EOS ends the reply without text
                spelled += entry.chosen.token_bytes
        assert spelled.decode() == stream.text, text


def test_sampled_tokens_report_the_raw_distribution(eco_stack: EcoStack, hf) -> None:
    """Temperature shapes the draw, not what is reported: vLLM's and OpenAI's convention."""
    text = PROMPTS[1]
    stream = eco_stack.router.generate(request(text, True, temperature=1.5))
    expected = hf_logprobs(hf, text, stream.token_ids)
    torch.testing.assert_close(chosen(stream), expected, atol=ATOL, rtol=0)


def test_a_stop_string_cuts_the_logprobs_with_the_tokens(eco_stack: EcoStack, greedy_runs) -> None:
    text = PROMPTS[0]
    full = greedy_runs[text, True]
    stop = full.text[len(full.text) // 2 :][:3]
    req = request(text, True)
    req.sampling.stop.append(stop)
    cut = eco_stack.router.generate(req)
    assert cut.final.finish_reason == pb.FINISH_REASON_STOP
    assert len(cut.token_ids) < len(full.token_ids)
    torch.testing.assert_close(chosen(cut), chosen(full)[: len(cut.token_ids)], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("logprobs", "top", "message"),
    [
        (True, 21, "top_logprobs must be at most 20, got 21"),
        (False, 3, "top_logprobs needs logprobs or prompt_logprobs = true"),
    ],
)
def test_bad_logprob_requests_are_refused(eco_stack: EcoStack, logprobs, top, message) -> None:
    req = request(PROMPTS[0], False)
    req.sampling.logprobs, req.sampling.top_logprobs = logprobs, top
    with pytest.raises(grpc.RpcError) as err:
        eco_stack.router.generate(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_a_request_that_does_not_ask_gets_none(eco_stack: EcoStack) -> None:
    req = request(PROMPTS[0], True)
    req.sampling.logprobs, req.sampling.top_logprobs = False, 0
    stream = eco_stack.router.generate(req)
    assert stream.token_ids and not any(item.logprobs for item in stream.items)
