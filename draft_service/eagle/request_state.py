"""An EAGLE drafter's per-request state and the pairs one append runs (draft_service/eagle/
drafter.py holds the invariants; the fixed-shape append reads them through new_pairs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draft_service.drafter import ContextChunk
from draft_service.eagle.append_graphs import NewPairs


@dataclass
class RequestState:
    """One request's draft state. Invariant: len(slots) == min(num_rows, len(token_ids) - 1).
    Its row of the request table (rows.py) holds the same slots and the head's feature at the
    last pair run, on the device."""

    token_ids: list[int]
    num_rows: int  # target hidden rows received
    pending: torch.Tensor  # host [num_rows - len(slots), H]: rows whose next token has not come
    slots: list[int]  # draft KV slot of pair t (position t)
    row: int  # the request's row of the request table

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
    return NewPairs(tokens, w.start, w.slots, w.state.pending[: w.count], w.state.row)
