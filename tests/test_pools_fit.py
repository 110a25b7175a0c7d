"""Slot pools larger than the free memory are refused before anything is allocated, in one line
that names the size, the free memory and the flag (it was the allocator's traceback)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from model_runtime.config import ModelConfig
from model_runtime.pools import PoolsTooLarge, SlotPools, free_bytes, pool_bytes

pytestmark = pytest.mark.timeout(120)
SHAPE = ModelConfig(
    name="shape", architecture="LlamaForCausalLM", vocab_size=64, hidden_size=32,
    intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    rms_norm_eps=1e-5, rope_theta=10000.0, max_position=64, tie_word_embeddings=True,
)  # fmt: skip
CPU = torch.device("cpu")


def test_pool_bytes_is_what_the_pools_take() -> None:
    pools = SlotPools(SHAPE, 100, torch.float32, CPU)
    assert pools.nbytes() == pool_bytes(SHAPE, 101, torch.float32)  # with the dummy slot


def test_pools_past_the_free_memory_are_refused_before_allocating() -> None:
    free = free_bytes(CPU)
    assert free is not None, "this machine has /proc/meminfo"
    slots = free // pool_bytes(SHAPE, 1, torch.float32) + 1
    with pytest.raises(PoolsTooLarge, match=rf"^{slots} slots need .* GiB free: lower --num-slots"):
        SlotPools(SHAPE, slots, torch.float32, CPU)


def test_the_target_says_its_slots_do_not_fit_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "target_service", "--port", "0", "--num-slots", str(10**9)],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert f"{10**9} slots need" in last and "lower --num-slots" in last, last
    assert "Traceback" not in done.stderr
