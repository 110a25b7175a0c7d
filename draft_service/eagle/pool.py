"""The draft head's own KV pool: context slots from a free list, a scratch region, a dummy slot."""

from __future__ import annotations

import torch

from model_runtime.config import ModelConfig
from model_runtime.lazy_zeros import zeros


class DraftPoolFull(RuntimeError):
    """The pool has fewer free context slots than an append needs; nothing was allocated."""


class DraftKVPool:
    """K/V rows for each head layer, indexed by slot.

    Layout: rows [0, num_slots) are context slots, owned by one request each and handed out by
    a free list; rows [num_slots, num_slots + num_scratch) are scratch for tree nodes during one
    propose (overwritten by the next); the last row is the dummy slot that padded keys point at
    (always masked out, never written). The pool is allocated once and never grows.
    """

    def __init__(
        self,
        target: ModelConfig,
        num_layers: int,
        num_slots: int,
        num_scratch: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_slots < 1 or num_scratch < 0:
            raise ValueError("num_slots must be >= 1 and num_scratch >= 0")
        self.num_slots = num_slots
        self.dummy_slot = num_slots + num_scratch
        shape = (num_slots + num_scratch + 1, target.num_kv_heads, target.head_dim)
        self.k = [zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [zeros(shape, dtype, device) for _ in range(num_layers)]
        self.scratch = torch.arange(num_slots, num_slots + num_scratch, device=device)
        # A stack; popping hands out low slots first, which keeps tests readable.
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def kv(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return self.k, self.v

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """``count`` free context slots; raises DraftPoolFull (allocating none) if short."""
        if count > len(self._free):
            raise DraftPoolFull(f"draft KV pool: {count} slots wanted, {len(self._free)} free")
        taken = self._free[len(self._free) - count :][::-1]
        del self._free[len(self._free) - count :]
        return taken

    def free(self, slots: list[int]) -> None:
        self._free.extend(reversed(slots))
