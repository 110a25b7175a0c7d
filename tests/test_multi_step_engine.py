"""K decode steps in one Forward (target_service/multi_step.py) against K separate Forwards.

In-process, on the tiny test model: through the engine's eager step, the graph runner's
fixed-shape body (what a CUDA graph replays; run eagerly on CPU) and, on CUDA, the captured
graphs. Mixed greedy and seeded requests, bursts cut short at the end, and one context that
crosses the runner's 256-key bucket inside a burst: the same tokens and the same KV and hidden
rows in every slot the steps wrote.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine
from target_service.graph_runner import DecodeGraphRunner
from target_service.request_table import SamplingSpec
from tests.helpers.spec_fixtures import load_copy
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

NUM_SLOTS = 1024
# The last prompt's context crosses 256 keys during the decode (the torch runner's bucket).
PROMPTS = [[1, 5, 9, 200, 31], [7, 7, 3], [(7 * i + 3) % 500 for i in range(250)]]
SPECS = [SamplingSpec(0.0, 1.0, 0, 0), SamplingSpec(0.8, 0.9, 20, 7), SamplingSpec(1.0, 1.0, 0, 3)]
NUM_TOKENS = 14  # after the prefill's: 4 + 4 + 4 + 2 at K = 4


def make_engine(model, device: str, graphs: bool | None, attention: str) -> TargetEngine:
    """graphs None: the engine's eager step; False: the runner's body eagerly; True: replay."""
    config = TargetConfig(
        model_path=Path("."), cache_dir=default_cache_dir(), num_slots=NUM_SLOTS, device=device,
        attention=attention, max_decode_steps=4,
    )  # fmt: skip
    engine = TargetEngine(config, model)
    if graphs is not None:
        table = engine.table.slots if engine.paged else None
        runner = DecodeGraphRunner(model, engine.pools, 300, (1, 2, 4), graphs, table)
        runner.capture_all()
        engine.attach_graphs(runner)
    return engine


def slots(request: int, start: int, count: int) -> list[int]:
    """Slots of positions [start, start + count): the same slot for a position in any run."""
    return list(range(300 * request + start, 300 * request + start + count))


def decode(engine: TargetEngine, steps: int) -> list[list[int]]:
    """Prefills every prompt, then decodes all together, ``steps`` decode steps a Forward."""
    items = [StepItem(f"r{i}", p, 0, slots(i, 0, len(p)), True, spec)
             for i, (p, spec) in enumerate(zip(PROMPTS, SPECS, strict=True))]  # fmt: skip
    out = [[t] for t in engine.forward(items).next_token_ids]
    while len(out[0]) < 1 + NUM_TOKENS:
        k = min(steps, 1 + NUM_TOKENS - len(out[0]))
        start = [len(p) + len(o) - 1 for p, o in zip(PROMPTS, out, strict=True)]
        step = [StepItem(f"r{i}", [o[-1]], start[i], slots(i, start[i], k))
                for i, o in enumerate(out)]  # fmt: skip
        ids = engine.forward(step, k).next_token_ids
        assert len(ids) == k * len(PROMPTS)
        for i, o in enumerate(out):
            o += ids[i * k : (i + 1) * k]  # item-major
    return out


def assert_same_pools(a: TargetEngine, b: TargetEngine) -> None:
    live = slice(0, a.pools.dummy_slot)  # graph capture's warm-up also wrote the dummy slot
    for x, y in zip(a.pools.all_pools(), b.pools.all_pools(), strict=True):
        assert torch.equal(x[live], y[live])


@pytest.mark.parametrize("graphs", [None, False], ids=["eager-step", "runner-body"])
def test_four_steps_a_forward_equal_one_step_a_forward(engine_model_dir: Path, graphs) -> None:
    model = load_copy(engine_model_dir, "cpu", torch.float32)
    one, four = (make_engine(model, "cpu", graphs, "torch") for _ in range(2))
    replays = count_runner_steps(four)
    assert decode(one, 1) == decode(four, 4)
    assert_same_pools(one, four)
    assert len(replays) == (0 if graphs is None else NUM_TOKENS)  # every step in the runner


def count_runner_steps(engine: TargetEngine) -> list[int]:
    """The batch size of each step the engine's graph runner ran (a spy: it still runs)."""
    calls: list[int] = []
    runner = engine.graphs
    if runner is not None:
        run = runner.run
        runner.run = lambda step: calls.append(step.input_ids.shape[0]) or run(step)  # type: ignore[method-assign]
    return calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attention", ["torch", "paged"])
def test_four_replays_a_forward_equal_one_replay_a_forward(
    engine_model_dir: Path, attention: str
) -> None:
    model = load_copy(engine_model_dir, "cuda", torch.float32)
    one, four = (make_engine(model, "cuda", True, attention) for _ in range(2))
    assert four.graphs is not None and four.graphs.graphs
    replays = count_runner_steps(four)
    assert decode(one, 1) == decode(four, 4)
    assert_same_pools(one, four)
    assert len(replays) == NUM_TOKENS
