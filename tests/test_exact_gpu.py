"""The target's --exact mode on CUDA (bf16 and fp32): paged attention plus the batch-invariant
matmul (kernels/invariant_matmul.py), so a continuation's hidden rows computed by one-token
decodes (replayed from the decode graphs), by one verify of the chain and by one prefill chunk
beside another request are equal bit for bit. Skipped without a GPU: the CPU exact mode has
its own test (tests/test_exact_cpu.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from model_runtime.fused import use_fused_kernels
from model_runtime.invariant import use_invariant_matmul
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.graph_runner import DecodeGraphRunner
from target_service.request_table import SamplingSpec
from tests.helpers.spec_fixtures import load_copy
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
NUM_SLOTS = 512
PROMPT, OTHER = [3, 9, 27, 81, 243, 5, 7, 11, 13], [100, 200, 300]
STEPS = 12


@pytest.fixture(params=["bfloat16", "float32"])
def exact_engine_factory(request, engine_model_dir: Path):
    dtype = request.param
    model = load_copy(engine_model_dir, "cuda", getattr(torch, dtype))
    use_fused_kernels(True)
    use_invariant_matmul(True)
    config = TargetConfig(
        model_path=Path("."), cache_dir=default_cache_dir(), device="cuda", dtype=dtype,
        num_slots=NUM_SLOTS, attention="paged", exact=True,
    )  # fmt: skip

    def make() -> TargetEngine:
        engine = TargetEngine(config, model)
        runner = DecodeGraphRunner(model, engine.pools, 512, (1, 2), table=engine.table.slots)
        runner.capture_all()
        engine.attach_graphs(runner)
        return engine

    yield make
    use_invariant_matmul(False)


def test_decode_verify_and_prefill_give_the_same_bits(exact_engine_factory) -> None:
    n = len(PROMPT)
    slots = iter(random.Random(0).sample(range(NUM_SLOTS), NUM_SLOTS))
    decoded = exact_engine_factory()
    prefill = StepItem("a", PROMPT, 0, [next(slots) for _ in PROMPT], True, GREEDY)
    tokens = decoded.forward([prefill]).next_token_ids
    for i in range(STEPS + 1):
        step = StepItem("a", [tokens[-1]], n + i, [next(slots)])
        tokens += decoded.forward([step]).next_token_ids
    by_decode = decoded.read_hidden("a", n, n + STEPS)

    verified = exact_engine_factory()
    verified.forward([StepItem("a", PROMPT, 0, [next(slots) for _ in PROMPT], True, GREEDY)])
    chain = tokens[: STEPS + 1]
    (result,), _ = verified.verify(
        [VerifyItem("a", n, chain, [-1, *range(STEPS)], [next(slots) for _ in chain], True)]
    )
    assert result.token_ids == tokens[1 : STEPS + 2], "the greedy chain was not all accepted"
    assert result.hidden is not None
    assert torch.equal(result.hidden[:STEPS], by_decode), "verify and decode round differently"

    chunked = exact_engine_factory()
    text = PROMPT + tokens[:STEPS]
    both = [StepItem("b", OTHER, 0, [next(slots) for _ in OTHER], True, GREEDY),
            StepItem("a", text, 0, [next(slots) for _ in text], True, GREEDY)]  # fmt: skip
    assert chunked.forward(both).next_token_ids[1] == tokens[STEPS]
    assert torch.equal(chunked.read_hidden("a", n, n + STEPS), by_decode), "prefill differs"
