"""Decode steps through the fixed-shape runner (target_service/graph_runner.py).

On CPU the runner runs its fixed-shape body eagerly: the same padding, buckets and buffers a
CUDA graph replays, checked against the engine's ordinary step. On CUDA (tests marked gpu) the
captured graphs are checked bit for bit against that eager body.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # the paged backend's Triton kernel runs interpreted on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import few_row_linear
from model_runtime.fused_layers import merge_projections
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine
from target_service.graph_runner import DecodeGraphRunner, bucket_for, context_buckets
from target_service.request_table import SamplingSpec
from tests.helpers.spec_fixtures import load_copy, load_fp64
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

PROMPTS = [[1, 5, 9, 200, 31], [7, 7, 3], [400, 12, 99, 5, 6, 8, 10], [42]]
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
SAMPLED = [GREEDY, SamplingSpec(0.8, 0.9, 20, 7), GREEDY, SamplingSpec(1.0, 1.0, 0, 3)]
# min_p rides in the graphs' static sampling buffers: these requests keep the graphs.
MIN_P = [GREEDY, SamplingSpec(0.8, 0.9, 20, 7, min_p=0.2), GREEDY,
         SamplingSpec(1.5, 1.0, 0, 3, min_p=0.3)]  # fmt: skip
NUM_SLOTS = 128
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_engine(
    model, dtype: str, graphs: bool | None, device: str = "cpu", attention: str = "torch"
) -> TargetEngine:
    """graphs None: the ordinary eager step; False: the runner's body eagerly; True: replay."""
    config = TargetConfig(
        model_path=Path("."), cache_dir=default_cache_dir(), dtype=dtype, num_slots=NUM_SLOTS,
        device=device, attention=attention,
    )  # fmt: skip
    engine = TargetEngine(config, model)
    if graphs is not None:
        table = engine.table.slots if engine.paged else None
        runner = DecodeGraphRunner(
            model, engine.pools, 300, (1, 2, 4), use_graphs=graphs, table=table
        )
        runner.capture_all()
        engine.attach_graphs(runner)
    return engine


def decode(engine: TargetEngine, specs: list[SamplingSpec], num_steps: int) -> list[list[int]]:
    """Prefills every prompt, then decodes all of them together for ``num_steps`` steps."""
    slots = iter(range(NUM_SLOTS))
    firsts = engine.forward(
        [
            StepItem(f"r{i}", p, 0, [next(slots) for _ in p], True, spec)
            for i, (p, spec) in enumerate(zip(PROMPTS, specs, strict=True))
        ]
    ).next_token_ids
    out = [[t] for t in firsts]
    for _ in range(num_steps):
        step = [
            StepItem(f"r{i}", [out[i][-1]], len(p) + len(out[i]) - 1, [next(slots)])
            for i, p in enumerate(PROMPTS)
        ]
        for i, t in enumerate(engine.forward(step).next_token_ids):
            out[i].append(t)
    return out


def skip_without_paged_backend() -> None:
    reason = few_row_linear.unavailable_reason()
    if reason is not None:  # on CPU the paged backend is kernels/exact_attention.h
        pytest.skip(f"the CPU attention kernel cannot run here: {reason}")


def test_context_buckets_cover_the_context() -> None:
    assert context_buckets(300) == (256, 512)
    assert context_buckets(256) == (256,)
    assert bucket_for(3, (1, 2, 4)) == 4 and bucket_for(5, (1, 2, 4)) is None


def test_runner_decodes_what_the_eager_step_decodes(engine_model_dir: Path) -> None:
    model = load_fp64(engine_model_dir)
    plain = make_engine(model, "float64", None)
    fixed = make_engine(model, "float64", False)
    assert decode(plain, SAMPLED, 12) == decode(fixed, SAMPLED, 12)
    torch.testing.assert_close(fixed.pools.hidden, plain.pools.hidden, rtol=0, atol=1e-10)


def test_runner_applies_min_p_as_the_eager_step_does(engine_model_dir: Path) -> None:
    model = load_fp64(engine_model_dir)
    plain = make_engine(model, "float64", None)
    fixed = make_engine(model, "float64", False)
    with_min_p = decode(plain, MIN_P, 12)
    assert with_min_p == decode(fixed, MIN_P, 12)
    assert with_min_p != decode(make_engine(model, "float64", None), SAMPLED, 12), "min_p is idle"


def test_paged_runner_decodes_what_the_paged_eager_step_decodes(engine_model_dir: Path) -> None:
    """The runner's body on the paged backend (Triton's interpreter on CPU): same tokens."""
    skip_without_paged_backend()
    model = load_copy(engine_model_dir, "cpu", torch.float32)
    plain = make_engine(model, "float32", None, attention="paged")
    fixed = make_engine(model, "float32", False, attention="paged")
    assert fixed.graphs is not None and fixed.graphs.table is not None
    assert decode(plain, SAMPLED, 6) == decode(fixed, SAMPLED, 6)
    torch.testing.assert_close(fixed.pools.hidden, plain.pools.hidden, rtol=0, atol=1e-6)


@pytest.mark.parametrize("attention", ["torch", "paged"])
def test_padded_rows_touch_only_the_dummy_slot(engine_model_dir: Path, attention: str) -> None:
    """A 3-request step runs in the 4-bucket: the padded row writes nowhere but the dummy."""
    if attention == "paged":
        skip_without_paged_backend()
    dtype = torch.float64 if attention == "torch" else torch.float32
    model = load_copy(engine_model_dir, "cpu", dtype)
    engine = make_engine(model, str(dtype).removeprefix("torch."), False, attention=attention)
    decode(engine, [GREEDY] * 4, 1)
    for pool in engine.pools.all_pools():
        pool[engine.pools.num_slots - 8 :].fill_(7.0)  # live-looking rows past the used ones
    before = [p.clone() for p in engine.pools.all_pools()]
    engine.release(["r3"])
    used = [len(p) + 1 for p in PROMPTS[:3]]
    row0 = engine.table.find("r0").row
    engine.table.slots[row0, used[0] + 1 :] = NUM_SLOTS - 5  # stale columns naming a live slot
    new_slots = [NUM_SLOTS - 8, NUM_SLOTS - 7, NUM_SLOTS - 6]
    engine.forward([StepItem(f"r{i}", [1], used[i], [new_slots[i]]) for i in range(3)])
    changed = set()
    for old, new in zip(before, engine.pools.all_pools(), strict=True):
        diff = (old != new).reshape(old.shape[0], -1).any(-1)
        changed |= set(diff.nonzero().flatten().tolist())
    assert changed <= {*new_slots, engine.pools.dummy_slot}
    assert set(new_slots) <= changed


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("variant", ["torch", "paged", "paged-merged"])
def test_graph_replay_is_bit_identical_to_the_eager_body(
    engine_model_dir: Path, dtype, variant: str
) -> None:
    """Each attention backend, and the merged decoder body (model_runtime/fused_layers.py)."""
    model = load_copy(engine_model_dir, "cuda", getattr(torch, dtype))
    if variant == "paged-merged":
        merge_projections(model)
    attention = variant.removesuffix("-merged")
    eager = make_engine(model, dtype, False, "cuda", attention)
    replay = make_engine(model, dtype, True, "cuda", attention)
    assert replay.graphs is not None and replay.graphs.graphs
    assert decode(eager, SAMPLED, 16) == decode(replay, SAMPLED, 16)
    live = slice(0, eager.pools.dummy_slot)  # capture's warm-up runs also wrote the dummy slot
    for a, b in zip(eager.pools.all_pools(), replay.pools.all_pools(), strict=True):
        assert torch.equal(a[live], b[live])


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["torch", "paged"])
def test_graph_replay_applies_min_p_as_the_eager_body(engine_model_dir: Path, attention) -> None:
    """min_p from the static sampling buffers: replayed, eager body and eager step agree, and
    the requests replay (min_p does not make them step aside)."""
    model = load_copy(engine_model_dir, "cuda", torch.float32)
    eager = make_engine(model, "float32", False, "cuda", attention)
    replay = make_engine(model, "float32", True, "cuda", attention)
    plain = make_engine(model, "float32", None, "cuda", attention)
    assert replay.graphs is not None
    runs = []
    real_run = replay.graphs.run

    def counted(step):
        runs.append(step.greedy)
        return real_run(step)

    replay.graphs.run = counted  # type: ignore[method-assign]
    want = decode(eager, MIN_P, 16)
    assert want == decode(replay, MIN_P, 16) == decode(plain, MIN_P, 16)
    assert len(runs) == 16 and not any(runs), "the sampled min_p steps did not replay"
