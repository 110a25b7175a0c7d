"""Completions' ``echo`` over the OpenAI HTTP API, driven by the official `openai` client against
the live stack: the prompt leads the text and, with ``logprobs``, the logprob lists (null for
the first token, the target's scores after it, HF transformers' values); ``max_tokens: 0``
scores the prompt alone, as scoring clients (lm-evaluation-harness's loglikelihood) ask; the
streamed reply says the same as the whole one."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import router_tokenizer
from tests.helpers.reference import HFReference

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is Paris. The capital of Italy is"
TOP = 2
ATOL = 2e-3  # fp32, two engines' kernels (tests/test_logprobs_engine.py)


@pytest.fixture(scope="module")
def client(eco_stack: EcoStack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=eco_stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=120.0
    )


def score(client: openai.OpenAI, eco: EcoStack, max_tokens: int, **extra):
    return client.completions.create(model=eco.model_name, prompt=PROMPT, echo=True,
                                     logprobs=TOP, max_tokens=max_tokens, temperature=0,
                                     **extra)  # fmt: skip


def test_echo_scores_the_prompt_as_hf_does(client, eco_stack: EcoStack, hf: HFReference) -> None:
    reply = score(client, eco_stack, 0)
    choice, lp = reply.choices[0], reply.choices[0].logprobs
    ids = router_tokenizer().encode(PROMPT)
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 0 and reply.usage.prompt_tokens == len(ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
    assert "".join(lp.tokens) == PROMPT
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(ids))]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    with torch.inference_mode():
        logits = hf.model(torch.tensor([ids])).logits[0, :-1]
    table = torch.log_softmax(logits.float(), dim=-1)
    want = table[torch.arange(len(ids) - 1), ids[1:]].tolist()
    assert lp.token_logprobs[1:] == pytest.approx(want, abs=ATOL)
    for top, row in zip(lp.top_logprobs[1:], table, strict=True):
        assert sorted(top.values(), reverse=True) == pytest.approx(
            row.topk(TOP).values.tolist(), abs=ATOL
        )


def test_echo_with_a_completion_and_streamed(client, eco_stack: EcoStack) -> None:
    prompt_only = score(client, eco_stack, 0).choices[0].logprobs
    reply = score(client, eco_stack, 4)
    text, lp = reply.choices[0].text, reply.choices[0].logprobs
    n = len(prompt_only.tokens)
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    assert len(lp.tokens) == n + reply.usage.completion_tokens == n + 4
    assert lp.tokens[:n] == prompt_only.tokens
    assert lp.token_logprobs[1:n] == pytest.approx(prompt_only.token_logprobs[1:], abs=ATOL)
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    chunks = list(score(client, eco_stack, 4, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    streamed = [x for p in parts for x in p.token_logprobs]
    assert streamed[0] is None
    assert streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=ATOL)


def test_echo_without_logprobs_and_the_refusals(client, eco_stack: EcoStack) -> None:
    reply = client.completions.create(model=eco_stack.model_name, prompt=PROMPT, echo=True,
                                      max_tokens=3, temperature=0)  # fmt: skip
    assert reply.choices[0].text.startswith(PROMPT) and reply.choices[0].logprobs is None
    status, body = eco_stack.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens", body  # 0 needs echo
    status, body = eco_stack.post("/v1/completions", {"prompt": PROMPT, "suffix": "x"})
    assert status == 400 and body["error"]["param"] == "suffix", body
