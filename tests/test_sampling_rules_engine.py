"""min_p, repetition_penalty and min_tokens on the target engine, in-process on the real default
model: verifying a draft chain gives what decoding one token a Forward gives (speculation =
target-only), the sampling decode graphs step aside only while a rule changes the logits
(on CUDA the LOGITS graphs run those steps), and
multi-step decoding refuses a request while its rule binds."""

from __future__ import annotations

import pytest

from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.errors import InvalidStep
from target_service.request_table import SamplingSpec
from tests.test_logit_bias_engine import PLAIN, greedy
from tests.test_logprobs_engine import NO_RUNNER, Replays, make_engine, model, prompt  # noqa: F401

NUM = 8


def verify_chain(engine: TargetEngine, ids: list[int], spec: SamplingSpec, chain: list[int]):
    """Prefill ``ids`` (its token sampled but not kept), then verify ``chain`` rooted at its
    first token: the result of the one verify."""
    start = len(ids)
    engine.forward([StepItem("r", ids, 0, list(range(start)), True, spec)])
    parents = list(range(-1, len(chain) - 1))
    tree = VerifyItem("r", start, chain, parents, list(range(start, start + len(chain))))
    return engine.verify([tree]).results[0]


def rep_spec(prompt: list[int]) -> SamplingSpec:  # noqa: F811
    return SamplingSpec(0.0, 1.0, 0, 0, repetition_penalty=1.6, repetition_context=tuple(prompt))


def test_repetition_penalty_verified_equals_decoded(model, prompt) -> None:  # noqa: F811
    plain = greedy(make_engine(model), prompt, PLAIN, NUM)
    engine = make_engine(model)
    replays = Replays(engine)
    ids = greedy(engine, prompt, rep_spec(prompt), NUM)
    assert ids != plain, "the penalty changed nothing"
    assert replays.count == 0  # no sampling graph ran the penalised steps (LOGITS ones may)
    for runner in (False, not NO_RUNNER):
        result = verify_chain(make_engine(model, runner), prompt, rep_spec(prompt), ids[:-1])
        assert result.token_ids == ids[1:] and result.num_accepted == NUM - 2


def test_min_tokens_bans_until_met_then_the_graphs_return(model, prompt) -> None:  # noqa: F811
    plain = greedy(make_engine(model), prompt, PLAIN, NUM)
    banned = (plain[1], plain[3])  # as if they were EOS and a stop token id
    spec = SamplingSpec(0.0, 1.0, 0, 0, min_tokens=3, min_tokens_banned_ids=banned)
    engine = make_engine(model)
    replays = Replays(engine)
    ids = greedy(engine, prompt, spec, NUM)
    assert ids[0] == plain[0] and not set(banned) & set(ids[:3]) and ids != plain
    steps_after_the_ban = NUM - 3
    assert replays.count in (0, steps_after_the_ban)  # 0: no graphs (CPU)
    for runner in (False, not NO_RUNNER):
        result = verify_chain(make_engine(model, runner), prompt, spec, ids[:-1])
        assert result.token_ids == ids[1:] and result.num_accepted == NUM - 2
    # The plain reply as a draft: its banned second token is refused, the bonus is ours.
    result = verify_chain(make_engine(model), prompt, spec, plain[:5])
    assert result.token_ids == [ids[1]] and result.num_accepted == 0


def test_min_p_one_keeps_only_the_argmax(model, prompt) -> None:  # noqa: F811
    """min_p 1 leaves the likeliest token alone: hot sampling with it is greedy, decoded or
    verified (the sampled verify's per-node parameters carry it too)."""
    plain = greedy(make_engine(model), prompt, PLAIN, NUM)
    spec = SamplingSpec(1.5, 1.0, 0, 1234, min_p=1.0)
    engine = make_engine(model)
    assert greedy(engine, prompt, spec, NUM) == plain
    result = verify_chain(make_engine(model), prompt, spec, plain[:-1])
    assert result.token_ids == plain[1:]
    loose = SamplingSpec(1.5, 1.0, 0, 1234)
    assert greedy(make_engine(model), prompt, loose, NUM) != plain, "the test is too weak"


def test_multi_step_refuses_them_while_they_bind(model, prompt) -> None:  # noqa: F811
    n = len(prompt)
    engine = make_engine(model)
    spec = SamplingSpec(0.0, 1.0, 0, 0, min_tokens=2, min_tokens_banned_ids=(5,))
    first = engine.forward([StepItem("r", prompt, 0, list(range(n + 12)), True, spec)])
    with pytest.raises(InvalidStep, match="need decode_steps 1"):
        engine.forward([StepItem("r", first.next_token_ids, n)], 4)
    second = engine.forward([StepItem("r", first.next_token_ids, n)])  # the ban is met now
    assert len(engine.forward([StepItem("r", second.next_token_ids, n + 1)], 4).next_token_ids) == 4
    rep = make_engine(model)
    rep.forward([StepItem("r", prompt, 0, list(range(n + 4)), True, rep_spec(prompt))])
    with pytest.raises(InvalidStep, match="need decode_steps 1"):
        rep.forward([StepItem("r", [7], n)], 4)


@pytest.mark.parametrize(
    "spec",
    [SamplingSpec(1.0, 1.0, 0, 0, min_p=1.5), SamplingSpec(0.0, 1.0, 0, 0, repetition_penalty=-1),
     SamplingSpec(0.0, 1.0, 0, 0, min_tokens=2, min_tokens_banned_ids=(10**9,))],
)  # fmt: skip
def test_bad_values_are_refused_before_anything_opens(model, prompt, spec) -> None:  # noqa: F811
    engine = make_engine(model)
    with pytest.raises(InvalidStep, match="min_p|repetition_penalty|min_tokens_banned_ids"):
        engine.forward([StepItem("r", prompt, 0, list(range(len(prompt))), True, spec)])
    assert len(engine.table) == 0
