"""What the draft service answers with a gRPC status of its own."""

from __future__ import annotations


class InvalidDraftInput(ValueError):
    """A message breaks the draft service contract (answered with INVALID_ARGUMENT)."""


class DraftOverloaded(RuntimeError):
    """The drafter has no room for the update now (answered with RESOURCE_EXHAUSTED)."""
