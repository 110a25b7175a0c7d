"""The interface every drafter implements, and the state contract the router relies on.

Per request a drafter holds the context tokens 0..L (token L is the next tree's root) and,
when ``needs_hidden``, the target's hidden rows 0..L-1. Updates must line up exactly with what
is held; otherwise the drafter raises ContextMismatch and the router re-ingests the context.
All of it is soft state: losing it costs speed only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draft_service.tree_types import DraftTree


class ContextMismatch(Exception):
    """An update does not continue the context the drafter holds (or it holds none)."""


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2 style tree budget: expand ``topk`` nodes per step for ``num_steps`` steps, keep
    the best ``num_draft_tokens`` nodes (root included)."""

    num_steps: int = 5
    topk: int = 4
    num_draft_tokens: int = 16

    def __post_init__(self) -> None:
        if self.num_steps < 1 or self.topk < 1 or self.num_draft_tokens < 2:
            raise ValueError("num_steps and topk must be >= 1, num_draft_tokens >= 2")


@dataclass
class ContextChunk:
    """Tokens (and hidden rows) appended to one request's context."""

    request_id: str
    start_pos: int
    token_ids: Sequence[int]
    hidden_start_pos: int = 0
    hidden: torch.Tensor | None = None  # [rows, hidden_size] on any device


class Drafter(ABC):
    method: str
    needs_hidden: bool = False

    @abstractmethod
    def append(self, chunk: ContextChunk) -> None:
        """Extends a request's context (starting one if start_pos == 0 and none is held).

        Raises ContextMismatch when the chunk does not continue the held context.
        """

    @abstractmethod
    def propose(self, request_ids: Sequence[str]) -> list[DraftTree]:
        """One tree per request (batched), rooted at its last context token."""

    @abstractmethod
    def release(self, request_id: str) -> bool:
        """Drops a request's state; returns whether any was held."""

    @abstractmethod
    def held_ids(self) -> list[str]:
        """The requests whose state is held."""

    def num_tokens(self, request_id: str) -> int:
        """Tokens held for a request (0 when none)."""
        return 0

    def take_device_ms(self) -> float:
        """The device's time on this drafter's kernels since the last take (after a sync);
        0 for a drafter with no device work of its own."""
        return 0.0
