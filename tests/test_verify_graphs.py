"""target_service/verify_graphs.py: the fixed-shape greedy verify step gives what the engine's own
verify gives (accepted tokens, counts, hidden rows, and every pool row but the dummy slot's),
with trees of several sizes padded into one bucket and padded requests beside them, and with
steps whose bucket is smaller than the last one's over poisoned static buffers (nothing stale
leaks). On CPU the step runs eagerly (the paged backend's C++ attention); on CUDA the same
test replays graphs.
"""

from __future__ import annotations

import random
from pathlib import Path
from unittest import mock

import pytest
import torch

from kernels import few_row_linear
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.request_table import SamplingSpec
from target_service.verify_graphs import VerifyGraphRunner
from tests.helpers.spec_fixtures import load_copy
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEVICE == "cpu" and few_row_linear.unavailable_reason() is not None,
    reason=f"the CPU attention kernel cannot run here: {few_row_linear.unavailable_reason()}",
)
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
GREEDY_MIN_P = SamplingSpec(0.0, 1.0, 0, 0, min_p=0.5)  # greedy ignores min_p: graphs keep it
NUM_SLOTS = 400
PROMPTS = [[3, 9, 27, 81, 243, 5, 7], [11, 13, 17], [100, 200, 300, 400, 500]]
CHAIN = 4  # greedy tokens planted as one branch of each tree: verify accepts them


def make_engine(model, runner: bool, tree_buckets: tuple[int, ...] = (16,)) -> TargetEngine:
    config = TargetConfig(
        model_path=Path("."), cache_dir=default_cache_dir(), dtype="float32",
        num_slots=NUM_SLOTS, device=DEVICE, attention="paged",
    )  # fmt: skip
    engine = TargetEngine(config, model)
    if runner:
        graphs = VerifyGraphRunner(model, engine.pools, engine.table.slots, (1, 4), tree_buckets)
        graphs.capture_all()
        engine.attach_verify_graphs(graphs)
    return engine


def greedy_continuations(model) -> list[list[int]]:
    """Each prompt's next CHAIN + 1 greedy tokens, decoded one by one (no tree involved)."""
    engine = make_engine(model, runner=False)
    slot = iter(range(NUM_SLOTS))
    out = []
    for i, prompt in enumerate(PROMPTS):
        ids = engine.forward(
            [StepItem(f"r{i}", prompt, 0, [next(slot) for _ in prompt], True, GREEDY)]
        ).next_token_ids
        for n in range(CHAIN):
            step = StepItem(f"r{i}", [ids[-1]], len(prompt) + n, [next(slot)])
            ids += engine.forward([step]).next_token_ids
        out.append(ids)
    return out


def prefill(
    engine: TargetEngine, continuations: list[list[int]], spec: SamplingSpec = GREEDY
) -> tuple:
    """Every prompt prefilled: the slot source, each request's root position and root token."""
    slot = iter(range(NUM_SLOTS))
    engine.forward(
        [StepItem(f"r{i}", p, 0, [next(slot) for _ in p], True, spec)
         for i, p in enumerate(PROMPTS)]
    )  # fmt: skip
    return slot, [len(p) for p in PROMPTS], [c[0] for c in continuations]


def verify_rounds(
    engine: TargetEngine, continuations: list[list[int]], seed: int, spec: SamplingSpec = GREEDY
) -> list:
    """Prefills every prompt, then two verify rounds of trees of different sizes."""
    rng = random.Random(seed)
    slot, starts, roots = prefill(engine, continuations, spec)
    outcomes = []
    for round_ in range(2):
        items = []
        for i, cont in enumerate(continuations):
            chain = [roots[i], *cont[1 : 1 + CHAIN]] if round_ == 0 else [roots[i]]
            tokens, parents = chain_with_siblings(rng, chain, siblings=2 + 3 * i)
            new_slots = [next(slot) for _ in range(24)] if round_ == 0 else []
            items.append(VerifyItem(f"r{i}", starts[i], tokens, parents, new_slots, True))
        results, *_ = engine.verify(items)
        for i, r in enumerate(results):
            starts[i] += 1 + r.num_accepted
            roots[i] = r.token_ids[-1]
        outcomes.append([(r.token_ids, r.num_accepted, r.hidden) for r in results])
    return outcomes


def chain_with_siblings(rng: random.Random, chain: list[int], siblings: int) -> tuple[list, list]:
    """``chain`` as a root-first path, plus ``siblings`` random nodes hung off path nodes."""
    tokens, parents = list(chain), [-1, *range(len(chain) - 1)]
    for _ in range(siblings):
        tokens.append(rng.randrange(1, 49152))
        parents.append(rng.randrange(len(chain)))
    return tokens, parents


@pytest.mark.parametrize("spec", [GREEDY, GREEDY_MIN_P], ids=["greedy", "greedy-min_p"])
def test_fixed_shape_verify_equals_the_engines_verify(engine_model_dir: Path, spec) -> None:
    model = load_copy(engine_model_dir, DEVICE, torch.float32)
    continuations = greedy_continuations(model)
    plain, fixed = make_engine(model, runner=False), make_engine(model, runner=True)
    assert fixed.verify_graphs is not None
    with mock.patch.object(fixed.verify_graphs, "run", wraps=fixed.verify_graphs.run) as spy:
        got = verify_rounds(fixed, continuations, seed=1, spec=spec)
    assert spy.call_count == 2  # both rounds took the fixed-shape step
    want = verify_rounds(plain, continuations, seed=1, spec=spec)
    assert got[0][0][1] == CHAIN, "the planted chain was not accepted"
    for round_got, round_want in zip(got, want, strict=True):
        for (ids_g, n_g, hidden_g), (ids_w, n_w, hidden_w) in zip(
            round_got, round_want, strict=True
        ):
            assert (ids_g, n_g) == (ids_w, n_w)
            torch.testing.assert_close(hidden_g, hidden_w, rtol=1e-5, atol=1e-5)
    assert_same_live_pools(fixed, plain)


def assert_same_live_pools(fixed: TargetEngine, plain: TargetEngine) -> None:
    """Every pool row but the dummy slot's (padding writes only that one)."""
    live = torch.ones(plain.pools.hidden.shape[0], dtype=torch.bool)
    live[plain.pools.dummy_slot] = False
    for a, b in zip(fixed.pools.all_pools(), plain.pools.all_pools(), strict=True):
        torch.testing.assert_close(a[live.to(a.device)], b[live.to(b.device)], rtol=1e-5, atol=1e-5)


# Rounds of (request, extra nodes hung off the root's path, return_hidden): each round's block
# is no larger than the last one's, in a bucket of another layout: (4, 16), then (1, 8), (4, 8);
# the last round's tree fits no bucket (the engine's own verify, beside the runner). Request 0's
# first tree is a bare chain, accepted to its last node, and the only tree of its round that
# asks for hidden rows: every row it has must come back.
SHRINKING = [
    [(0, 0, True), (1, 5, False), (2, 8, False)],
    [(1, 2, True)],
    [(0, 5, True), (2, 3, True)],
    [(1, 19, True)],
]


def shrinking_rounds(engine: TargetEngine, continuations: list[list[int]], poison: bool) -> list:
    """Prefills every prompt, then the SHRINKING rounds (the first one's chains get accepted);
    with ``poison``, the runner's static buffers and their host twins are filled with junk
    before every step."""
    rng = random.Random(3)
    slot, starts, roots = prefill(engine, continuations)
    outcomes = []
    for round_, trees in enumerate(SHRINKING):
        items = []
        for i, siblings, want in trees:
            cont = continuations[i]
            chain = [roots[i], *cont[1 : 1 + CHAIN]] if round_ == 0 else [roots[i]]
            tokens, parents = chain_with_siblings(rng, chain, siblings)
            new_slots = [next(slot) for _ in range(32)] if round_ == 0 else []
            items.append(VerifyItem(f"r{i}", starts[i], tokens, parents, new_slots, want))
        if poison and engine.verify_graphs is not None:
            for buffers in (engine.verify_graphs.buffers, engine.verify_graphs.staging):
                for buffer in (buffers.inputs, buffers.ids, buffers.hidden):
                    buffer.fill_(3)  # a live row, slot and position: a leak would show
        results, *_ = engine.verify(items)
        for (i, *_), r in zip(trees, results, strict=True):
            starts[i] += 1 + r.num_accepted
            roots[i] = r.token_ids[-1]
        outcomes.append([(r.token_ids, r.num_accepted, r.hidden) for r in results])
    return outcomes


def test_smaller_steps_over_poisoned_buffers_equal_the_engines_verify(
    engine_model_dir: Path,
) -> None:
    model = load_copy(engine_model_dir, DEVICE, torch.float32)
    continuations = greedy_continuations(model)
    plain = make_engine(model, runner=False)
    fixed = make_engine(model, runner=True, tree_buckets=(8, 16))
    assert fixed.verify_graphs is not None
    with mock.patch.object(fixed.verify_graphs, "run", wraps=fixed.verify_graphs.run) as spy:
        got = shrinking_rounds(fixed, continuations, poison=True)
    assert spy.call_count == len(SHRINKING) - 1  # all but the 20-node tree
    want = shrinking_rounds(plain, continuations, poison=False)
    assert [n for _, n, _ in got[0]] == [CHAIN] * 3, "the planted chains were not accepted"
    assert got[0][1][2] is None, "a tree that asks for no hidden rows gets none"
    for round_got, round_want in zip(got, want, strict=True):
        for (ids_g, n_g, hidden_g), (ids_w, n_w, hidden_w) in zip(
            round_got, round_want, strict=True
        ):
            assert (ids_g, n_g) == (ids_w, n_w)
            if hidden_w is None:
                assert hidden_g is None
            else:
                assert hidden_g is not None and hidden_g.is_contiguous()
                torch.testing.assert_close(hidden_g, hidden_w, rtol=1e-5, atol=1e-5)
    assert_same_live_pools(fixed, plain)


def test_it_advertises_the_masked_batch_its_graphs_take(engine_model_dir: Path) -> None:
    """TargetInfo.masked_verify_graph_batch: the router gives forced-token chains to no more
    trees than this on CUDA (router/forced_steps.py); a CPU runner captures nothing."""
    engine = make_engine(load_copy(engine_model_dir, DEVICE, torch.float32), runner=True)
    assert engine.verify_graphs is not None
    assert engine.verify_graphs.masked_graph_batch() == (4 if DEVICE == "cuda" else 0)
