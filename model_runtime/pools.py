"""Device memory indexed by router-assigned slots: the KV pool and the hidden-state pool."""

from __future__ import annotations

from pathlib import Path

import torch

from model_runtime.config import ModelConfig
from model_runtime.lazy_zeros import zeros
from plumbing.errors import StartupRefused


class PoolsTooLarge(StartupRefused, ValueError):
    """The slot pools asked for do not fit the device's free memory: said before allocating,
    instead of the allocator's error (or the kernel's OOM killer) part way through."""


class SlotPools:
    """KV rows for every layer plus one hidden-state row per slot.

    Slots 0..num_slots-1 belong to the router, which assigns them to context positions. Slot
    ``num_slots`` is the dummy slot: padded rows of a fixed-shape step write there, so they
    can never touch a live slot.
    """

    def __init__(
        self, config: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.num_slots = num_slots
        self.dummy_slot = num_slots
        rows = num_slots + 1
        check_fits(config, rows, dtype, device)
        shape = (rows, config.num_kv_heads, config.head_dim)
        self.k = [zeros(shape, dtype, device) for _ in range(config.num_layers)]
        self.v = [zeros(shape, dtype, device) for _ in range(config.num_layers)]
        # The last decoder layer's output (before the final norm) of every token run: what an
        # EAGLE drafter consumes. Kept under the same slot index as the token's KV.
        self.hidden = zeros((rows, config.hidden_size), dtype, device)

    def all_pools(self) -> list[torch.Tensor]:
        """Every tensor whose first dimension is the slot index (for compaction)."""
        return [*self.k, *self.v, self.hidden]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.all_pools())


def pool_bytes(config: ModelConfig, rows: int, dtype: torch.dtype) -> int:
    per_row = 2 * config.num_layers * config.num_kv_heads * config.head_dim + config.hidden_size
    return rows * per_row * torch.empty((), dtype=dtype).element_size()


def check_fits(config: ModelConfig, rows: int, dtype: torch.dtype, device: torch.device) -> None:
    needed, free = pool_bytes(config, rows, dtype), free_bytes(device)
    if free is not None and needed > free:
        raise PoolsTooLarge(
            f"{rows - 1} slots need {needed / 2**30:.1f} GiB of KV and hidden-state pools "
            f"({pool_bytes(config, 1, dtype)} bytes a slot) and {device} has "
            f"{free / 2**30:.1f} GiB free: lower --num-slots"
        )


def free_bytes(device: torch.device) -> int | None:
    """Memory the pools may take: CUDA's free memory, or the kernel's MemAvailable on a CPU;
    None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
