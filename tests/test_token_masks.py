"""Structured output on the target (target_service/token_masks.py): the allowed-token masks'
bit layout, and the engine in-process on the real default model applying them at every route
a token is committed by (the eager step and the eager verify, sampled and greedy; the decode
graphs' LOGITS mode and the masked verify graphs, on CPU through the same bodies run eagerly),
refusing malformed masks before anything opens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from target_service import token_masks
from target_service.engine import StepItem, VerifyItem
from target_service.errors import InvalidStep
from target_service.graph_runner import DecodeGraphRunner
from target_service.request_table import SamplingSpec
from tests.test_logit_bias_engine import PLAIN, greedy
from tests.test_logprobs_engine import (  # noqa: F401
    DEVICE,
    NO_RUNNER,
    Replays,
    make_engine,
    model,
    prompt,
)

VOCAB = 49152


def mask_of(token_ids: list[int], vocab: int = VOCAB) -> bytes:
    """llguidance's layout, built with numpy's own little-endian bit packing."""
    bits = np.zeros(token_masks.words_for(vocab) * 32, dtype=np.uint8)
    bits[token_ids] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def test_bits_unpack_in_llguidance_order() -> None:
    ids = [0, 1, 31, 32, 33, 1000, VOCAB - 1]
    keep = token_masks.allowed([mask_of(ids), b""], VOCAB, torch.device(DEVICE))
    assert torch.nonzero(keep[0]).flatten().tolist() == ids
    assert bool(keep[1].all())  # an empty mask allows everything


def test_a_short_mask_disallows_what_it_does_not_cover() -> None:
    keep = token_masks.allowed([mask_of([3, 40])[:8]], VOCAB, torch.device(DEVICE))
    assert torch.nonzero(keep[0]).flatten().tolist() == [3, 40]


def test_tree_rows_follow_their_nodes() -> None:
    logits = torch.zeros(2, 3, 100)
    masks = [mask_of([5], 100) + mask_of([6], 100), b""]
    out = token_masks.restrict_tree(logits, masks, [2, 3])
    assert out[0, 0].argmax() == 5 and out[0, 1].argmax() == 6
    assert out[0, 2].isfinite().all() and out[1].isfinite().all()  # padding, unconstrained


def test_decoding_follows_the_mask(model, prompt) -> None:  # noqa: F811
    plain = greedy(make_engine(model), prompt, PLAIN, 4)
    engine = make_engine(model)
    replays = Replays(engine)
    allowed = [plain[0], 11, 12]  # the first step's own choice, then a forced pair
    n = len(prompt)
    first = engine.forward([StepItem("r", prompt, 0, list(range(n + 3)), True, PLAIN, [],
                                     mask_of(allowed))])  # fmt: skip
    assert first.next_token_ids == [plain[0]]
    step = engine.forward([StepItem("r", [plain[0]], n, [], True, None, [], mask_of([11, 12]))])
    assert step.next_token_ids[0] in (11, 12)
    assert replays.count == 0  # no sampling graph ran a masked step (the logits graphs may)
    drawn = SamplingSpec(1.0, 1.0, 0, 7)
    engine.forward([StepItem("s", prompt, 0, list(range(n + 1)), False, drawn)])
    sampled = engine.forward([StepItem("s", [prompt[-1]], n - 1, [], True, None, [],
                                       mask_of([21, 22]))])  # fmt: skip
    assert sampled.next_token_ids[0] in (21, 22)


@pytest.mark.parametrize(
    ("spec", "runner"),
    [(PLAIN, False), (PLAIN, True), (SamplingSpec(1.0, 1.0, 0, 3), False)],
    ids=["greedy", "greedy-verify-graphs", "sampled"],
)
def test_verifying_masks_each_node(model, prompt, spec, runner) -> None:  # noqa: F811
    """A chain of the greedy reply, with node 2's mask forbidding the reply's own next token:
    nodes 1 and 2 are accepted under masks that allow only them, the third draft is rejected,
    and the bonus is the one token node 2's mask allows; through the eager verify, or the
    verify runner's masked graphs (its body run eagerly on CPU)."""
    if runner and NO_RUNNER:
        pytest.skip("the verify runner needs the CPU paged kernel, which did not build here")
    plain = greedy(make_engine(model), prompt, PLAIN, 5)
    engine = make_engine(model, verify_runner=runner)
    calls = []
    if runner:
        run = engine.verify_graphs.run
        engine.verify_graphs.run = lambda *a: calls.append(a[-1] is not None) or run(*a)
    start = len(prompt)
    engine.forward([StepItem("r", prompt, 0, list(range(start)), True, spec)])
    chain = plain[:4]
    masks = mask_of([plain[1]]) + mask_of([plain[2]]) + mask_of([99]) + mask_of([plain[4]])
    tree = VerifyItem("r", start, chain, [-1, 0, 1, 2], list(range(start, start + 4)), False,
                      masks)  # fmt: skip
    result = engine.verify([tree]).results[0]
    assert result.num_accepted == 2 and result.token_ids == [plain[1], plain[2], 99]
    assert calls == ([True] if runner else [])


def test_malformed_masks_are_refused_before_anything_opens(model, prompt) -> None:  # noqa: F811
    engine = make_engine(model)
    n = len(prompt)
    for bad in (b"\x01\x02\x03", mask_of([1]) + b"\x00" * 4):
        with pytest.raises(InvalidStep, match="allowed_tokens needs"):
            engine.forward([StepItem("r", prompt, 0, list(range(n)), True, PLAIN, [], bad)])
    with pytest.raises(InvalidStep, match="sample = true"):
        engine.forward([StepItem("r", prompt, 0, list(range(n)), False, PLAIN, [], mask_of([1]))])
    assert len(engine.table) == 0
    engine.forward([StepItem("r", prompt, 0, list(range(n + 4)), True, PLAIN)])
    with pytest.raises(InvalidStep, match="decode_steps 1"):
        engine.forward([StepItem("r", [7], n, [], True, None, [], mask_of([1]))], 4)
    tree = VerifyItem("r", n, [7, 8], [-1, 0], [], False, mask_of([1])[:12])  # 1.5 words a node
    with pytest.raises(InvalidStep, match="2 mask"):
        engine.verify([tree])


@pytest.mark.parametrize("spec", [PLAIN, SamplingSpec(0.8, 0.9, 0, 5, 0.5, 0.3)],
                         ids=["greedy", "sampled-penalised"])  # fmt: skip
def test_logits_graphs_give_the_eager_steps_ids(model, prompt, spec) -> None:  # noqa: F811
    """Masked (and penalised) decode steps through the LOGITS graphs and the changes after
    them equal the eager step's, token for token, with the graphs really replayed (on CPU the
    runner runs the same body eagerly)."""
    masks = [mask_of(list(range(t, 49152, 3))) for t in range(3)]  # a third of the vocabulary
    runs = [decode_masked(model, prompt, spec, masks, graphs) for graphs in (True, False)]
    assert runs[0][0] == runs[1][0] and runs[0][1] == 7
    assert all(t % 3 == k % 3 for k, t in enumerate(runs[0][0][1:]))


def decode_masked(model, prompt, spec, masks, graphs: bool) -> tuple[list[int], int]:  # noqa: F811
    """The prefill's token and 7 more under the masks in turn; with the graphs or without, and
    how many LOGITS replays ran."""
    engine = make_engine(model)
    if engine.graphs is None and graphs:  # CPU: the runner's body, run eagerly
        table = engine.table.slots if engine.paged else None
        runner = DecodeGraphRunner(model, engine.pools, engine.max_context, table=table)
        engine.attach_graphs(runner)
    replays = []
    if graphs:
        run_logits = engine.graphs.run_logits
        engine.graphs.run_logits = lambda step: replays.append(1) or run_logits(step)
    else:
        engine.graphs = None  # every step eager
    n = len(prompt)
    first = StepItem("r", prompt, 0, list(range(n + 8)), True, spec)
    ids = engine.forward([first]).next_token_ids
    for k in range(7):
        step = StepItem("r", [ids[-1]], n + k, [], True, None, [], masks[k % 3])
        ids += engine.forward([step]).next_token_ids
    return ids, len(replays)
