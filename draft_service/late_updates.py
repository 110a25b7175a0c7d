"""A late Propose's update, sent again: what the replica already holds is not appended twice.

A replica that misses a Propose deadline is skipped (router/replica_health.py), and the
update it missed goes out again merged with the next one (router/skipped_rounds.py). A
replica that was only late, not hung, has applied the first update by then, so the merged
one starts behind its context and used to answer needs_context: a whole-context re-ingest for
one late call. When the merged update begins with exactly the last update this replica
applied, and nothing was applied since, that part is dropped and the rest appended.
"""

from __future__ import annotations

from draft_service.drafter import ContextChunk


def num_rows(chunk: ContextChunk) -> int:
    return 0 if chunk.hidden is None else int(chunk.hidden.shape[0])


class AppliedUpdates:
    """The last Propose update applied per request, as the router sent it."""

    def __init__(self) -> None:
        self._last: dict[str, ContextChunk] = {}

    def applied(self, chunk: ContextChunk) -> None:
        self._last[chunk.request_id] = chunk

    def forget(self, request_id: str) -> None:
        self._last.pop(request_id, None)

    def unapplied_part(self, chunk: ContextChunk, held_tokens: int) -> ContextChunk:
        """``chunk`` without its prefix that is the last applied update, where the drafter
        holds exactly that update's end (``held_tokens``); else ``chunk`` unchanged."""
        last = self._last.get(chunk.request_id)
        if last is None or not _extends(chunk, last):
            return chunk
        tokens, rows = len(last.token_ids), num_rows(last)
        if held_tokens != last.start_pos + tokens:
            return chunk  # the drafter moved on (or never got there): not the late case
        hidden = chunk.hidden[rows:] if chunk.hidden is not None else None
        return ContextChunk(
            chunk.request_id,
            chunk.start_pos + tokens,
            list(chunk.token_ids[tokens:]),
            chunk.hidden_start_pos + rows,
            hidden if hidden is None or hidden.shape[0] else None,
        )


def _extends(chunk: ContextChunk, last: ContextChunk) -> bool:
    """Whether ``chunk`` is ``last`` followed by more tokens: the same start, last's tokens
    first, and last's hidden rows first (the target's rows of those positions, so equal)."""
    n = len(last.token_ids)
    if chunk.start_pos == 0 or chunk.start_pos != last.start_pos or len(chunk.token_ids) <= n:
        return False
    if list(chunk.token_ids[:n]) != list(last.token_ids):
        return False
    rows = num_rows(last)
    same_rows_start = chunk.hidden_start_pos == last.hidden_start_pos
    return rows == 0 or (same_rows_start and num_rows(chunk) >= rows)
