"""Drafters for tests only (`--method scripted` and `--method recording`).

Nothing user-facing depends on them; they exist so end-to-end tests can pin what the router
sends to a replica and what verification does with a known-good proposal:

- `ScriptedDrafter` proposes continuations read from a JSON file, so a test that scripts the
  target's own greedy output can check that every drafted token is accepted.
- `RecordingDrafter` drafts like "ngram" but needs hidden rows (so the router sends them) and
  writes what it received per request to a folder that tests read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

import torch

from draft_service.drafter import ContextChunk, ContextMismatch, Drafter, TreeShape
from draft_service.ngram_drafter import NgramContextDrafter, check_continues
from draft_service.tree_types import DraftTree


def load_scripts(path: Path) -> list[list[int]]:
    """Reads a script file: a JSON list of token-id lists, or {"continuations": [...]} of one."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = data.get("continuations")
    if not isinstance(data, list) or not all(isinstance(s, list) for s in data):
        raise ValueError(f"{path}: expected a JSON list of token-id lists")
    for i, script in enumerate(data):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in script):
            raise ValueError(f"{path}: script {i} holds something other than token ids >= 0")
    return [list(s) for s in data]


def script_continuation(
    scripts: Sequence[Sequence[int]], context: Sequence[int], max_tokens: int
) -> list[int]:
    """What `ScriptedDrafter` proposes after `context` (the tokens after the root).

    The rule: for every script s and every end position j (1 <= j <= len(s)), the alignment
    length k(s, j) is the largest k >= 1 with s[j-k:j] == context[-k:] (so k <= min(j,
    len(context))); positions where even the last token differs do not align. The alignment with
    the largest k wins; ties go to the earlier script in the file, then the smaller j. The
    proposal is s[j : j + max_tokens] (empty when nothing aligns or j == len(s)).

    So a script holding a request's whole expected sequence (prompt + output), or just its
    output, makes every proposal the next expected tokens.
    """
    best_k, best = 0, (0, 0)
    for index, script in enumerate(scripts):
        for end in range(1, len(script) + 1):
            k = _common_suffix(script, end, context)
            if k > best_k:
                best_k, best = k, (index, end)
    if best_k == 0:
        return []
    index, end = best
    return list(scripts[index][end : end + max_tokens])


def _common_suffix(script: Sequence[int], end: int, context: Sequence[int]) -> int:
    k, limit = 0, min(end, len(context))
    while k < limit and script[end - 1 - k] == context[-1 - k]:
        k += 1
    return k


class ScriptedDrafter(Drafter):
    """Proposes a chain of up to num_draft_tokens - 1 scripted tokens (see `script_continuation`),
    every node scored 1.0. Test only."""

    method = "scripted"
    needs_hidden = False

    def __init__(self, shape: TreeShape, scripts: list[list[int]]) -> None:
        self.shape = shape
        self.scripts = scripts
        self._contexts: dict[str, list[int]] = {}

    @classmethod
    def from_file(cls, shape: TreeShape, path: Path) -> ScriptedDrafter:
        return cls(shape, load_scripts(path))

    def append(self, chunk: ContextChunk) -> None:
        held = self._contexts.get(chunk.request_id)
        check_continues(chunk, None if held is None else len(held))
        self._contexts.setdefault(chunk.request_id, []).extend(chunk.token_ids)

    def propose(self, request_ids: Sequence[str]) -> list[DraftTree]:
        return [self._propose_one(request_id) for request_id in request_ids]

    def _propose_one(self, request_id: str) -> DraftTree:
        context = self._contexts.get(request_id)
        if not context:
            raise ContextMismatch(f"request {request_id!r} holds no tokens to root a tree")
        chain = script_continuation(self.scripts, context, self.shape.num_draft_tokens - 1)
        return DraftTree(
            token_ids=[context[-1], *chain],
            parent_indices=list(range(-1, len(chain))),
            scores=[1.0] * (len(chain) + 1),
        )

    def release(self, request_id: str) -> bool:
        return self._contexts.pop(request_id, None) is not None

    def held_ids(self) -> list[str]:
        return list(self._contexts)

    def num_tokens(self, request_id: str) -> int:
        return len(self._contexts.get(request_id, ()))


@dataclass
class ChunkRecord:
    start_pos: int
    num_tokens: int
    hidden_start_pos: int
    num_hidden_rows: int
    hidden_sum: float


@dataclass
class RequestRecord:
    """What `RecordingDrafter` writes to `<record_dir>/<quoted request_id>.json`.

    token_ids and the hidden_* fields describe the context held now (since the last start at
    position 0); `chunks` lists every accepted append since the process started, across restarts.
    Sums are float64 over the rows' values as received.
    """

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    num_hidden_rows: int = 0
    hidden_size: int = 0
    hidden_sum: float = 0.0
    hidden_row_sums: list[float] = field(default_factory=list)
    num_starts: int = 0
    num_mismatches: int = 0
    released: bool = False
    chunks: list[ChunkRecord] = field(default_factory=list)


def record_path(record_dir: Path, request_id: str) -> Path:
    """Where a request's record lives: its id percent-quoted (no '/'), plus '.json'."""
    return Path(record_dir) / f"{quote(request_id, safe='')}.json"


class RecordingDrafter(Drafter):
    """Drafts like NgramContextDrafter, needs hidden rows, and records what it received. Test only.

    Hidden rows follow the same rule as tokens: a chunk that carries rows must start them at the
    rows held (its hidden_start_pos), else ContextMismatch; a chunk without rows ignores
    hidden_start_pos. Every append, mismatch and release rewrites the request's record file
    atomically (write to a temporary file, then rename). Records are never deleted.
    """

    method = "recording"
    needs_hidden = True

    def __init__(self, shape: TreeShape, record_dir: Path) -> None:
        self.shape = shape
        self.record_dir = Path(record_dir)
        self.record_dir.mkdir(parents=True, exist_ok=True)
        self.hidden_size = 0  # learnt from the first rows received; 0 until then
        self._inner = NgramContextDrafter(shape)
        self._records: dict[str, RequestRecord] = {}
        self._held: set[str] = set()

    def append(self, chunk: ContextChunk) -> None:
        record = self._records.setdefault(chunk.request_id, RequestRecord(chunk.request_id))
        try:
            self._check_hidden(chunk, record)
            self._inner.append(chunk)  # checks tokens; mutates nothing when it raises
        except ContextMismatch:
            record.num_mismatches += 1
            self._write(record)
            raise
        self._apply(chunk, record)
        self._write(record)

    def _check_hidden(self, chunk: ContextChunk, record: RequestRecord) -> None:
        if chunk.hidden is None or chunk.hidden.shape[0] == 0:
            return
        if chunk.hidden.dim() != 2:
            raise ValueError(f"hidden rows must be 2-D, got shape {tuple(chunk.hidden.shape)}")
        if self.hidden_size and chunk.hidden.shape[1] != self.hidden_size:
            raise ValueError(
                f"hidden rows have {chunk.hidden.shape[1]} columns, expected {self.hidden_size}"
            )
        num_held = record.num_hidden_rows if chunk.request_id in self._held else 0
        if chunk.hidden_start_pos != num_held:
            raise ContextMismatch(
                f"request {chunk.request_id!r} holds {num_held} hidden rows; "
                f"update starts them at {chunk.hidden_start_pos}"
            )

    def _apply(self, chunk: ContextChunk, record: RequestRecord) -> None:
        if chunk.request_id not in self._held:
            self._held.add(chunk.request_id)
            record.token_ids, record.num_hidden_rows, record.hidden_sum = [], 0, 0.0
            record.hidden_row_sums, record.released = [], False
            record.num_starts += 1
        record.token_ids.extend(int(t) for t in chunk.token_ids)
        num_rows, chunk_sum = 0, 0.0
        if chunk.hidden is not None and chunk.hidden.shape[0] > 0:
            rows = chunk.hidden.detach().to("cpu", dtype=torch.float64)
            num_rows, chunk_sum = rows.shape[0], float(rows.sum())
            self.hidden_size = record.hidden_size = rows.shape[1]
            record.hidden_row_sums.extend(rows.sum(dim=1).tolist())
        record.num_hidden_rows += num_rows
        record.hidden_sum += chunk_sum
        record.chunks.append(
            ChunkRecord(
                chunk.start_pos, len(chunk.token_ids), chunk.hidden_start_pos, num_rows, chunk_sum
            )
        )

    def propose(self, request_ids: Sequence[str]) -> list[DraftTree]:
        return self._inner.propose(request_ids)

    def release(self, request_id: str) -> bool:
        self._inner.release(request_id)
        if request_id not in self._held:
            return False
        self._held.discard(request_id)
        record = self._records[request_id]
        record.released = True
        self._write(record)
        return True

    def held_ids(self) -> list[str]:
        return list(self._held | set(self._inner.held_ids()))

    def num_tokens(self, request_id: str) -> int:
        return self._inner.num_tokens(request_id)

    def _write(self, record: RequestRecord) -> None:
        path = record_path(self.record_dir, record.request_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(record)))
        os.replace(tmp, path)
