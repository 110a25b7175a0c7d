"""The CPU pools' zeros (model_runtime/lazy_zeros.py): torch.zeros' values, and memory that
becomes resident only as it is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draft_service.eagle.pool import DraftKVPool
from model_runtime.config import ModelConfig
from model_runtime.lazy_zeros import zeros
from model_runtime.pools import SlotPools

MIB = 2**20
SHAPE = ModelConfig(
    name="shape", architecture="LlamaForCausalLM", vocab_size=64, hidden_size=32,
    intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position=64, tie_word_embeddings=True,
)  # fmt: skip


def _resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_they_are_zeros_that_take_writes(dtype: torch.dtype) -> None:
    pool = zeros((5, 3, 4), dtype, torch.device("cpu"))
    assert pool.shape == (5, 3, 4) and pool.dtype == dtype and pool.is_contiguous()
    assert torch.equal(pool, torch.zeros(5, 3, 4, dtype=dtype))
    pool[2] = 7
    assert int(pool.sum()) == 7 * 12
    assert zeros((0, 4), dtype, "cpu").shape == (0, 4)


def test_a_pool_is_resident_only_where_written() -> None:
    before = _resident_bytes()
    pool = zeros((256 * MIB // 4,), torch.float32, torch.device("cpu"))
    assert _resident_bytes() - before < 32 * MIB  # torch.zeros: all 256 MiB, written up front
    pool[: 64 * MIB // 4] = 1.0
    assert _resident_bytes() - before >= 60 * MIB
    assert float(pool[64 * MIB // 4 :].abs().sum()) == 0.0


def test_the_services_pools_start_as_zeros() -> None:
    cpu = torch.device("cpu")
    target = SlotPools(SHAPE, 64, torch.float32, cpu)
    draft = DraftKVPool(SHAPE, 1, 16, 8, torch.float32, cpu)
    for pool in [*target.all_pools(), *draft.k, *draft.v]:
        assert not pool.any()
