"""Prompt log-probabilities through the public gRPC API, end to end (real target, EAGLE
replica and router): ``SamplingParams.prompt_logprobs`` scores every prompt token after the
first under the target's distribution, HF transformers' log-softmax over the same weights, on
the first stream item, across the prefill's chunks and whatever the radix cache holds.
"""

from __future__ import annotations

import grpc
import pytest
import torch

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import Prompt, pick_prompts
from tests.helpers.reference import HFReference
from tests.helpers.rpc import Stream

pytestmark = pytest.mark.slow
TOP = 3
ATOL = 2e-3  # fp32, two engines' kernels (tests/test_logprobs_engine.py)


@pytest.fixture(scope="module")
def long_prompt() -> Prompt:
    """Longer than the router's 512 tokens a step: its prefill runs in two chunks."""
    (prompt,) = pick_prompts([(600, 900)], start=5200)
    return prompt


def request(prompt: Prompt, speculate: bool = True) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.input_ids.ids.extend(prompt.ids)
    req.sampling.max_new_tokens = 6
    req.sampling.temperature = 0.0
    req.sampling.prompt_logprobs = True
    req.sampling.top_logprobs = TOP
    req.speculation.enabled = speculate
    return req


def hf_table(hf: HFReference, ids: tuple[int, ...]) -> torch.Tensor:
    """[L - 1, V]: HF's log-softmax of position p + 1 under the row of position p."""
    with torch.inference_mode():
        logits = hf.model(torch.tensor([list(ids)])).logits[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


def assert_scores(stream: Stream, ids: tuple[int, ...], table: torch.Tensor) -> None:
    first, *rest = stream.items
    assert not any(item.prompt_logprobs for item in rest), "scores only on the first item"
    scores = list(first.prompt_logprobs)
    assert [e.chosen.token_id for e in scores] == list(ids[1:])
    chosen = torch.tensor([e.chosen.logprob for e in scores])
    torch.testing.assert_close(chosen, table[torch.arange(len(ids) - 1), list(ids[1:])],
                               atol=ATOL, rtol=0)  # fmt: skip
    tops = torch.tensor([[t.logprob for t in e.top] for e in scores])
    torch.testing.assert_close(tops, table.topk(TOP, dim=-1).values, atol=ATOL, rtol=0)
    assert all(e.chosen.token_bytes or e.chosen.token_id in (0, 1, 2) for e in scores)


def test_a_chunked_prompt_is_scored_as_hf_scores_it(
    eco_stack: EcoStack, long_prompt: Prompt, hf: HFReference
) -> None:
    plain = eco_stack.router.generate(request(long_prompt, speculate=False))
    scored = plain.items[0].prompt_logprobs
    assert len(scored) == len(long_prompt.ids) - 1
    assert_scores(plain, long_prompt.ids, hf_table(hf, long_prompt.ids))
    assert not any(item.logprobs for item in plain.items)  # none asked for the reply's


def test_a_cached_prompt_is_scored_in_full_and_speculation_changes_nothing(
    eco_stack: EcoStack, long_prompt: Prompt
) -> None:
    """The first request left the prompt in the radix cache: a scoring request computes it
    again (the cache holds KV, not scores); the reply and the reply's logprobs are those of
    a request that did not score."""
    again = request(long_prompt)
    again.sampling.logprobs = True
    scored = eco_stack.router.generate(again)
    assert scored.final.usage.cached_tokens == 0
    base = request(long_prompt, speculate=False)
    base.sampling.prompt_logprobs, base.sampling.logprobs = False, True
    unscored = eco_stack.router.generate(base)
    assert unscored.final.usage.cached_tokens > 0  # the cache still serves those that do not score
    assert scored.token_ids == unscored.token_ids
    assert not any(item.prompt_logprobs for item in unscored.items)
    got = [e.chosen.logprob for item in scored.items for e in item.logprobs]
    want = [e.chosen.logprob for item in unscored.items for e in item.logprobs]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=ATOL, rtol=0)


def test_a_one_token_prompt_has_nothing_to_score(eco_stack: EcoStack, long_prompt) -> None:
    req = request(Prompt("", long_prompt.ids[:1]))
    stream = eco_stack.router.generate(req)
    assert stream.token_ids and not stream.items[0].prompt_logprobs


def test_top_logprobs_without_either_flag_is_refused(eco_stack: EcoStack, long_prompt) -> None:
    req = request(long_prompt)
    req.sampling.prompt_logprobs = False
    with pytest.raises(grpc.RpcError) as err:
        eco_stack.router.generate(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_logprobs needs logprobs or prompt_logprobs" in err.value.details()
