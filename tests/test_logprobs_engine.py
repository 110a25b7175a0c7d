"""Log-probabilities from the target engine (target_service/logprobs.py), in-process on the
real default model: every way a token is committed reports the model's own distribution at the
right position.

A greedy continuation is decoded three ways: one Forward a token, four decode steps a Forward
(multi-step; on CUDA the captured decode graphs), and one verify of the whole continuation as a
chain (on CUDA the verify graphs). Each way's log-probabilities, chosen and top-5, must be
HF transformers' log-softmax at the same positions on the same weights (an independent
forward over prompt + continuation), and the three must agree with one another. A greedy
token is the most likely one, so its log-probability is the first of its top list. Under
--exact, decoding and verifying give the same bits.
"""

from __future__ import annotations

import pytest
import torch

from kernels import few_row_linear
from model_runtime.invariant import use_invariant_matmul
from model_runtime.loading import default_model_path, load_model
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.errors import InvalidStep
from target_service.logprob_pass import TokenLogprobs
from target_service.request_table import SamplingSpec
from target_service.server import attach_graphs, build_engine
from tests.helpers.prompts import chat_ids
from tests.helpers.reference import HFReference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOP = 5
SPEC = SamplingSpec(0.0, 1.0, 0, 0, logprobs=True, top_logprobs=TOP)
NUM_NEW = 12  # continuation tokens after the prefill's
NUM_SLOTS = 512
# fp32 here and in HF; kernels differ (paged attention, fused layers), log-softmax values a few
# 1e-4 apart at most on this model (measured 2e-5 on the 2-core CPU box, 2026-12-04).
ATOL = 2e-3


@pytest.fixture(scope="module")
def model():
    device = torch.device(DEVICE)
    return load_model(default_model_path(), torch.float32, device, default_cache_dir())


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return list(chat_ids([{"role": "user", "content": "Name three colours of the rainbow."}]))


# The verify runner (target_service/verify_graphs.py) needs the paged attention: on CPU its
# C++ kernel, where it builds (its step then runs eagerly; on CUDA it replays graphs).
NO_RUNNER = DEVICE == "cpu" and few_row_linear.unavailable_reason() is not None


def make_engine(model, verify_runner: bool = False) -> TargetEngine:
    """``verify_runner``: greedy verifies through the runner (it computes the logprobs
    before its sync); else the eager verify (the engine reads them after the step)."""
    attention = "paged" if verify_runner else "auto"
    config = TargetConfig(
        model_path=default_model_path(), cache_dir=default_cache_dir(), dtype="float32",
        num_slots=NUM_SLOTS, device=DEVICE, max_decode_steps=4, verify_graphs=verify_runner,
        attention=attention,
    )  # fmt: skip
    engine = TargetEngine(config, model)
    attach_graphs(engine, model)  # CUDA: decode graphs; the verify runner where asked
    return engine


class Replays:
    """Counts the graph runners' steps (CUDA): logprob requests must keep the graphs."""

    def __init__(self, engine: TargetEngine) -> None:
        self.count = 0
        for runner in (engine.graphs, engine.verify_graphs):
            if runner is not None:
                runner.run = self._counting(runner.run)  # type: ignore[method-assign]

    def _counting(self, run):
        def counted(*args, **kwargs):
            self.count += 1
            return run(*args, **kwargs)

        return counted


def decode(engine: TargetEngine, prompt: list[int], steps: int) -> tuple[list[int], TokenLogprobs]:
    """The prefill's token and NUM_NEW more, ``steps`` decode steps a Forward."""
    first = engine.forward([StepItem("r", prompt, 0, list(range(len(prompt))), True, SPEC)])
    ids, lp = list(first.next_token_ids), first.logprobs[0]
    while len(ids) < 1 + NUM_NEW:
        k = min(steps, 1 + NUM_NEW - len(ids))
        start = len(prompt) + len(ids) - 1
        step = engine.forward([StepItem("r", [ids[-1]], start, list(range(start, start + k)))], k)
        ids += step.next_token_ids
        _extend(lp, step.logprobs[0])
    return ids, lp


def verify_chain(
    engine: TargetEngine, prompt: list[int], chain: list[int]
) -> tuple[list[int], TokenLogprobs]:
    """The prefill, then one verify of ``chain`` (its first token the root): all accepted,
    and a bonus token after them."""
    first = engine.forward([StepItem("r", prompt, 0, list(range(len(prompt))), True, SPEC)])
    start = len(prompt)
    tree = VerifyItem("r", start, chain, list(range(-1, len(chain) - 1)),
                      list(range(start, start + len(chain))))  # fmt: skip
    result = engine.verify([tree]).results[0]
    assert [chain[0], *result.token_ids] == [*chain, result.token_ids[-1]], "not all accepted"
    lp = first.logprobs[0]
    _extend(lp, result.logprobs)
    return [chain[0], *result.token_ids], lp


def _extend(into: TokenLogprobs, more: TokenLogprobs | None) -> None:
    assert more is not None
    into.token_logprobs += more.token_logprobs
    into.top_ids += more.top_ids
    into.top_logprobs += more.top_logprobs


def hf_logprobs(hf: HFReference, prompt: list[int], ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: HF's log-softmax at the positions that chose ``ids``."""
    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt + ids[:-1]])).logits[0, len(prompt) - 1 :]
    return torch.log_softmax(logits.float(), dim=-1)


def assert_matches(lp: TokenLogprobs, ids: list[int], reference: torch.Tensor) -> None:
    assert len(lp.token_logprobs) == len(ids)
    assert len(lp.top_ids) == len(lp.top_logprobs) == TOP * len(ids)
    chosen = reference[torch.arange(len(ids)), torch.tensor(ids)]
    torch.testing.assert_close(torch.tensor(lp.token_logprobs), chosen, atol=ATOL, rtol=0)
    top = torch.tensor(lp.top_logprobs).view(len(ids), TOP)
    top_ids = torch.tensor(lp.top_ids).view(len(ids), TOP)
    torch.testing.assert_close(top, reference.gather(1, top_ids), atol=ATOL, rtol=0)
    assert bool((top[:, :-1] >= top[:, 1:]).all()), "top lists not most likely first"
    # Greedy: the chosen token is the most likely one (exact ties aside, none here).
    assert lp.token_logprobs == top[:, 0].tolist()
    assert top_ids[:, 0].tolist() == ids


def test_every_commit_path_reports_the_models_distribution(model, prompt, hf) -> None:
    runner = not NO_RUNNER
    engines = [make_engine(model), make_engine(model), make_engine(model, runner)]
    replays = [Replays(engine) for engine in engines]
    ids, one_a_forward = decode(engines[0], prompt, 1)
    reference = hf_logprobs(hf, prompt, ids)
    assert_matches(one_a_forward, ids, reference)
    four_ids, four_a_forward = decode(engines[1], prompt, 4)
    assert four_ids == ids
    assert_matches(four_a_forward, ids, reference)
    verified_ids, verified = verify_chain(engines[2], prompt, ids)
    assert_matches(verified, verified_ids, hf_logprobs(hf, prompt, verified_ids))
    eager_ids, eager_verified = verify_chain(make_engine(model), prompt, ids)
    assert eager_ids == verified_ids
    assert_matches(eager_verified, verified_ids, hf_logprobs(hf, prompt, verified_ids))
    if DEVICE == "cuda":  # decode steps, multi-step bursts and the verify replayed graphs
        assert all(r.count > 0 for r in replays), [r.count for r in replays]
    elif runner:  # the verify went through the runner's step
        assert replays[2].count > 0
    # One engine's paths agree more closely than either with HF.
    torch.testing.assert_close(
        torch.tensor(verified.token_logprobs[: len(ids)]),
        torch.tensor(one_a_forward.token_logprobs),
        atol=1e-4,
        rtol=0,
    )


@pytest.mark.parametrize(
    "verify_runner",
    [
        False,
        pytest.param(True, marks=pytest.mark.skipif(
            NO_RUNNER, reason=f"the CPU paged kernel: {few_row_linear.unavailable_reason()}"
        )),
    ],
    ids=["eager-verify", "verify-runner"],
)  # fmt: skip
def test_each_tree_of_a_mixed_batch_gets_its_own(model, prompt, verify_runner: bool) -> None:
    """Trees of other depths (padded in one batch), one cut short by a wrong draft, beside one
    whose request did not ask: each asking tree gets its committed tokens' values, the same as
    verified alone."""
    ids, _ = decode(make_engine(model), prompt, 1)
    chains = {"long": ids[:6], "cut": [ids[0], ids[1], (ids[2] + 1) % 1000, ids[3]], "not": ids[:3]}
    specs = {"long": SPEC, "cut": SamplingSpec(0.0, 1.0, 0, 0, logprobs=True, top_logprobs=2),
             "not": SamplingSpec(0.0, 1.0, 0, 0)}  # fmt: skip
    engine = make_engine(model, verify_runner)
    start = len(prompt)
    trees = []
    for i, (name, chain) in enumerate(chains.items()):
        base = 128 * i
        slots = list(range(base, base + start))
        engine.forward([StepItem(name, prompt, 0, slots, True, specs[name])])
        tree_slots = list(range(base + start, base + start + len(chain)))
        trees.append(VerifyItem(name, start, chain, list(range(-1, len(chain) - 1)), tree_slots))
    long, cut, plain = engine.verify(trees).results
    assert (long.num_accepted, cut.num_accepted) == (5, 1) and plain.logprobs is None
    assert cut.token_ids == [ids[1], ids[2]]  # the wrong draft rejected, the target's token
    assert long.logprobs is not None and cut.logprobs is not None
    assert len(long.logprobs.token_logprobs) == 6 and len(long.logprobs.top_ids) == 6 * TOP
    assert len(cut.logprobs.token_logprobs) == 2 and len(cut.logprobs.top_ids) == 2 * 2
    _, alone = verify_chain(make_engine(model, verify_runner), prompt, ids[:6])
    torch.testing.assert_close(
        torch.tensor(long.logprobs.token_logprobs),
        torch.tensor(alone.token_logprobs[1:]),  # [0] is the prefill's token
        atol=1e-5,
        rtol=0,
    )
    torch.testing.assert_close(
        torch.tensor(cut.logprobs.token_logprobs),
        torch.tensor(alone.token_logprobs[1:3]),
        atol=1e-5,
        rtol=0,
    )


@pytest.mark.skipif(
    DEVICE == "cpu" and few_row_linear.unavailable_reason() is not None,
    reason=f"--exact on CPU needs its kernels: {few_row_linear.unavailable_reason()}",
)
def test_exact_mode_gives_decode_and_verify_the_same_bits(prompt) -> None:
    """--exact (bf16 on CUDA, fp32 on CPU), engines built as the service builds them: the
    verified chain's log-probabilities equal one-token decoding's bit for bit."""
    dtype = "bfloat16" if DEVICE == "cuda" else "float32"
    config = TargetConfig(
        model_path=default_model_path(), cache_dir=default_cache_dir(), dtype=dtype,
        num_slots=NUM_SLOTS, device=DEVICE, exact=True, attention="paged",
        verify_graphs=DEVICE == "cuda",
    )  # fmt: skip
    try:
        ids, decoded = decode(build_engine(config), prompt, 1)
        verified_ids, verified = verify_chain(build_engine(config), prompt, ids)
    finally:
        use_invariant_matmul(False)  # build_engine turned it on for the process
    assert verified_ids[: len(ids)] == ids
    assert verified.token_logprobs[: len(ids)] == decoded.token_logprobs
    assert verified.top_ids[: TOP * len(ids)] == decoded.top_ids
    assert verified.top_logprobs[: TOP * len(ids)] == decoded.top_logprobs


def test_a_request_that_did_not_ask_gets_none_beside_one_that_did(model, prompt) -> None:
    engine = make_engine(model)
    plain = SamplingSpec(0.0, 1.0, 0, 0)
    items = [
        StepItem("asks", prompt, 0, list(range(len(prompt))), True, SPEC),
        StepItem("not", prompt, 0, list(range(256, 256 + len(prompt))), True, plain),
    ]
    result = engine.forward(items)
    assert result.logprobs is not None and result.logprobs[1] is None
    assert len(result.logprobs[0].token_logprobs) == 1
    alone = engine.forward([StepItem("b", prompt, 0, list(range(100, 100 + len(prompt))), True,
                                     plain)])  # fmt: skip
    assert alone.logprobs is None  # nobody asked: no pass at all


def test_too_many_top_logprobs_is_refused(model, prompt) -> None:
    engine = make_engine(model)
    spec = SamplingSpec(0.0, 1.0, 0, 0, logprobs=True, top_logprobs=21)
    with pytest.raises(InvalidStep, match="top_logprobs 21 exceeds 20"):
        engine.forward([StepItem("r", prompt, 0, list(range(len(prompt))), True, spec)])
    assert len(engine.table) == 0  # nothing opened
