"""The target's --exact mode on CUDA (bf16 and fp32): paged attention plus the batch-invariant
matmul (kernels/invariant_matmul.py), so a continuation's hidden rows computed by one-token
decodes (replayed from the decode graphs), by one verify of the chain and by one prefill chunk
beside another request are equal bit for bit. Skipped without a GPU: the CPU exact mode has
its own test (tests/test_exact_cpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_runtime.fused import use_fused_kernels
from model_runtime.invariant import use_invariant_matmul
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import TargetEngine
from target_service.graph_runner import DecodeGraphRunner
from target_service.request_table import SamplingSpec
from tests.helpers.exact_checks import assert_step_kinds_agree
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
    assert_step_kinds_agree(exact_engine_factory, PROMPT, OTHER, STEPS, NUM_SLOTS)
