"""Device memory indexed by router-assigned slots: the KV pool and the hidden-state pool."""

from __future__ import annotations

import torch

from model_runtime.config import ModelConfig


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
        shape = (rows, config.num_kv_heads, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        # The last decoder layer's output (before the final norm) of every token run: what an
        # EAGLE drafter consumes. Kept under the same slot index as the token's KV.
        self.hidden = torch.zeros((rows, config.hidden_size), dtype=dtype, device=device)

    def all_pools(self) -> list[torch.Tensor]:
        """Every tensor whose first dimension is the slot index (for compaction)."""
        return [*self.k, *self.v, self.hidden]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.all_pools())
