"""An EAGLE drafter's per-request state and the pairs one append runs (draft_service/eagle/
drafter.py holds the invariants; the fixed-shape append reads them through new_pairs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draft_service.drafter import ContextChunk
from draft_service.eagle.append_graphs import NewPairs


@dataclass
class RequestState:
    """One request's draft state. Invariant: len(slots) == min(num_rows, len(token_ids) - 1)."""

    token_ids: list[int]
    num_rows: int  # target hidden rows received
    pending: torch.Tensor  # [num_rows - len(slots), H]: rows whose next token has not arrived
    slots: list[int]  # draft KV slot of pair t (position t)
    slot_row: torch.Tensor  # the same slots on the device
    feature: torch.Tensor | None = None  # [H] head output at the last pair run

    @property
    def ready(self) -> bool:
        return self.num_rows == len(self.token_ids) - 1


@dataclass
class PairWork:
    """Pairs one append runs for a request: positions [start, start + count)."""

    state: RequestState
    start: int
    count: int
    slots: list[int]


def num_rows(chunk: ContextChunk) -> int:
    return 0 if chunk.hidden is None else int(chunk.hidden.shape[0])


def new_pairs(w: PairWork) -> NewPairs:
    tokens = w.state.token_ids[w.start + 1 : w.start + w.count + 1]
    return NewPairs(tokens, w.start, w.slots, w.state.pending[: w.count], w.state.slot_row)
