"""logit_bias on the target engine, in-process on the real default model: every route a token
is committed by applies it (the eager step, the eager verify; on CUDA the decode and verify
graphs, which change no logits, step aside for such a request), and multi-step decoding,
which cannot apply it, refuses it before anything changes."""

from __future__ import annotations

import pytest

from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.errors import InvalidStep
from target_service.request_table import SamplingSpec
from tests.test_logprobs_engine import NO_RUNNER, Replays, make_engine, model, prompt  # noqa: F401

PLAIN = SamplingSpec(0.0, 1.0, 0, 0)


def greedy(engine: TargetEngine, ids: list[int], spec: SamplingSpec, n: int) -> list[int]:
    """The prefill's token (``ids`` the prompt) and n - 1 more, one decode step a Forward."""
    first = engine.forward([StepItem("r", ids, 0, list(range(len(ids) + n)), True, spec)])
    out = list(first.next_token_ids)
    while len(out) < n:
        start = len(ids) + len(out) - 1
        out += engine.forward([StepItem("r", [out[-1]], start)]).next_token_ids
    return out


def test_decoding_and_verifying_apply_it(model, prompt) -> None:  # noqa: F811
    plain = greedy(make_engine(model), prompt, PLAIN, 6)
    banned = SamplingSpec(0.0, 1.0, 0, 0, logit_bias=((plain[2], -100.0),))
    engine = make_engine(model)
    replays = Replays(engine)
    biased = greedy(engine, prompt, banned, 6)
    assert biased[:2] == plain[:2] and plain[2] not in biased
    assert replays.count == 0  # no sampling graph ran the biased steps (LOGITS ones may)
    # Verify the unbiased reply as a chain: the bias rejects the banned draft and the bonus
    # is the biased argmax there.
    runner = make_engine(model, verify_runner=not NO_RUNNER)
    start = len(prompt)
    runner.forward([StepItem("r", prompt, 0, list(range(start)), True, banned)])
    chain = plain[:5]
    tree = VerifyItem("r", start, chain, list(range(-1, 4)), list(range(start, start + 5)))
    result = runner.verify([tree]).results[0]
    assert result.token_ids == [plain[1], biased[2]] and result.num_accepted == 1


def test_multi_step_refuses_it(model, prompt) -> None:  # noqa: F811
    engine = make_engine(model)
    banned = SamplingSpec(0.0, 1.0, 0, 0, logit_bias=((5, -100.0),))
    n = len(prompt)
    engine.forward([StepItem("r", prompt, 0, list(range(n + 4)), True, banned)])
    with pytest.raises(InvalidStep, match="logit_bias need decode_steps 1"):
        engine.forward([StepItem("r", [7], n)], 4)


@pytest.mark.parametrize("bias", [((10**9, 1.0),), ((3, 150.0),), ((3, float("nan")),)])
def test_bad_maps_are_refused_before_anything_opens(model, prompt, bias) -> None:  # noqa: F811
    engine = make_engine(model)
    spec = SamplingSpec(0.0, 1.0, 0, 0, logit_bias=bias)
    with pytest.raises(InvalidStep, match="logit_bias needs token ids"):
        engine.forward([StepItem("r", prompt, 0, list(range(len(prompt))), True, spec)])
    assert len(engine.table) == 0
