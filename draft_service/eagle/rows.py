"""The drafter's device request table: one row per request held, like the target's slot table.

Row r holds the request's draft KV slot of each context pair (column = position) and the head's
feature at its last pair (the next tree's root). The append writes both on the device, and the
tree search reads them by row inside its graph, so a round copies nothing per request but its
new pairs. The last row belongs to padding: its columns hold the dummy slot, which padded pairs
write and read, and its feature is whatever padded pairs computed (never read by a real row).
"""

from __future__ import annotations

import torch

from draft_service.eagle.pool import DraftPoolFull


class DraftRowsFull(DraftPoolFull):
    """Every request row is taken; nothing was allocated (the service answers
    RESOURCE_EXHAUSTED, as for a full KV pool)."""


class DraftRows:
    def __init__(
        self,
        num_rows: int,
        width: int,
        hidden_size: int,
        dummy_slot: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if num_rows < 1 or width < 1:
            raise ValueError("need at least one row and one column")
        self.pad_row = num_rows
        self.width = width
        self.slots = torch.full((num_rows + 1, width), dummy_slot, dtype=torch.long, device=device)
        self.features = torch.zeros((num_rows + 1, hidden_size), dtype=dtype, device=device)
        self._free = list(range(num_rows - 1, -1, -1))  # a stack: low rows first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise DraftRowsFull(f"all {self.pad_row} request rows of the drafter are taken")
        return self._free.pop()

    def free(self, row: int) -> None:
        """The row's old slots stay: a row is read only up to its holder's context length."""
        self._free.append(row)
