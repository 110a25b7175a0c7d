"""Prompt log-probabilities from the target engine (target_service/prompt_scores.py),
in-process on the real default model: a prompt run in chunks, each chunk scoring its tokens'
successors, reports HF transformers' log-softmax at every prompt position.

The reference is an independent HF forward over the whole prompt on the same weights; the
engine's chunks run the paged or the plain attention over the pools, so the values agree to a
few 1e-4 at most (fp32).
"""

from __future__ import annotations

import pytest
import torch

from target_service.engine import StepItem, TargetEngine
from target_service.errors import InvalidStep
from target_service.logprob_pass import TokenLogprobs
from target_service.request_table import SamplingSpec
from tests.helpers.prompts import chat_ids
from tests.test_logprobs_engine import ATOL, make_engine, model  # noqa: F401 (the fixture)

TOP = 4
SCORING = SamplingSpec(0.0, 1.0, 0, 0, top_logprobs=TOP)  # prompt scores only
PLAIN = SamplingSpec(0.0, 1.0, 0, 0)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    text = "Write one sentence about the sea, then one about the mountains."
    return list(chat_ids([{"role": "user", "content": text}]))


def scored_chunks(
    engine: TargetEngine, prompt: list[int], sizes: list[int], rid: str = "r", base: int = 0
) -> tuple[TokenLogprobs, int]:
    """The prompt in chunks of ``sizes`` (the last takes the rest and samples), each scoring
    the prompt tokens that follow its own; the scores joined, and the sampled token."""
    joined = TokenLogprobs([], [], [])
    start, next_id = 0, -1
    while start < len(prompt):
        n = sizes.pop(0) if sizes else len(prompt) - start
        last = start + n >= len(prompt)
        slots = list(range(base + start, base + start + n))
        spec = SCORING if start == 0 else None
        item = StepItem(rid, prompt[start : start + n], start, slots, last, spec,
                        prompt[start + 1 : start + n + 1])  # fmt: skip
        result = engine.forward([item])
        assert result.scored is not None and result.scored[0] is not None
        answer = result.scored[0]
        joined.token_logprobs += answer.token_logprobs
        joined.top_ids += answer.top_ids
        joined.top_logprobs += answer.top_logprobs
        next_id = result.next_token_ids[0] if last else next_id
        start += n
    return joined, next_id


def test_a_chunked_prompt_scores_every_position_as_hf_does(model, prompt, hf) -> None:  # noqa: F811
    scores, next_id = scored_chunks(make_engine(model), prompt, [7, 1, 13])
    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt])).logits[0, :-1]
    reference = torch.log_softmax(logits.float(), dim=-1)  # [L - 1, V]: position p+1 under row p
    scored = torch.tensor(prompt[1:])
    assert len(scores.token_logprobs) == len(prompt) - 1
    chosen = reference[torch.arange(len(scored)), scored]
    torch.testing.assert_close(torch.tensor(scores.token_logprobs), chosen, atol=ATOL, rtol=0)
    top = torch.tensor(scores.top_logprobs).view(-1, TOP)
    top_ids = torch.tensor(scores.top_ids).view(-1, TOP)
    torch.testing.assert_close(top, reference.topk(TOP, dim=-1).values, atol=ATOL, rtol=0)
    torch.testing.assert_close(top, reference.gather(1, top_ids), atol=ATOL, rtol=0)
    # A prompt is not the model's greedy text: some of its tokens are not the likeliest.
    assert (top_ids[:, 0] != scored).any()
    # Scoring changed nothing the step samples.
    plain = make_engine(model).forward(
        [StepItem("p", prompt, 0, list(range(len(prompt))), True, PLAIN)]
    )
    assert plain.next_token_ids == [next_id] and plain.scored is None


def test_an_item_that_scores_nothing_gets_none_beside_one_that_does(model, prompt) -> None:  # noqa: F811
    engine = make_engine(model)
    n = len(prompt)
    items = [
        StepItem("plain", prompt, 0, list(range(n)), True, PLAIN),
        StepItem("scores", prompt, 0, list(range(256, 256 + n)), True, SCORING, prompt[1:]),
    ]
    result = engine.forward(items)
    assert result.scored is not None and result.scored[0] is None
    assert len(result.scored[1].token_logprobs) == n - 1
    assert result.logprobs is None  # neither asked for its sampled token's
    assert result.next_token_ids[0] == result.next_token_ids[1]


def test_a_one_token_step_that_scores_runs_eagerly_and_answers(model, prompt) -> None:  # noqa: F811
    """One sampled token per item is what a decode graph replays (CUDA): a step that scores
    must not take that route, which computes no rows to score."""
    engine = make_engine(model)
    n = len(prompt)
    engine.forward([StepItem("r", prompt[:-1], 0, list(range(n)), False, SCORING)])
    result = engine.forward([StepItem("r", prompt[-1:], n - 1, [], True, None, [42])])
    assert result.scored is not None and len(result.scored[0].token_logprobs) == 1


@pytest.mark.parametrize(
    ("scored", "steps", "message"),
    [
        ([1, 2, 3], 1, "3 scored ids for 2 tokens"),
        ([10**9], 1, "scored id outside"),
        ([5], 4, "no scored ids"),
    ],
)
def test_bad_scored_ids_are_refused_before_anything_changes(
    model, prompt, scored: list[int], steps: int, message: str  # noqa: F811
) -> None:
    engine = make_engine(model)
    tokens = prompt[:2] if steps == 1 else prompt[:1]
    item = StepItem("r", tokens, 0, list(range(8)), True, SCORING, scored)
    with pytest.raises(InvalidStep, match=message):
        engine.forward([item], steps)
    assert len(engine.table) == 0
