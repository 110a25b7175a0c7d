"""EAGLE drafter: per-request draft KV filled from target hidden rows, EAGLE-2 trees on propose.

Context contract (see draft_service.drafter): a request holds tokens x_0..x_L and target hidden
rows h_0..h_{L-1}. The head runs once over every *pair* (x_{t+1}, h_t) at position t, writing
its K/V into a context slot of the draft pool; the output at the last pair predicts the root's
children. During a chunked ingest tokens and rows may arrive unevenly, so a request has run
exactly min(rows, tokens - 1) pairs at any time, and is ready to propose once
rows == tokens - 1 (>= 0). Tree nodes live in scratch slots for one propose only: the next
append brings the accepted tokens with their true target rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draft_service.drafter import ContextChunk, ContextMismatch, Drafter, TreeShape
from draft_service.eagle.append_graphs import AppendGraphRunner
from draft_service.eagle.eager_append import run_pairs_eagerly
from draft_service.eagle.head import EagleHead
from draft_service.eagle.pool import DraftKVPool, DraftPoolFull
from draft_service.eagle.request_state import PairWork, RequestState, new_pairs, num_rows
from draft_service.eagle.rows import DraftRows
from draft_service.eagle.search_graphs import Proposals, SearchGraphRunner
from draft_service.eagle.tree_search import SearchInputs, rerank, search_tree
from draft_service.tree_types import DraftTree
from model_runtime.device_clock import DeviceClock

__all__ = ["DraftPoolFull", "EagleDrafter"]


class EagleDrafter(Drafter):
    """Batched EAGLE head drafting over an own KV pool and request table (both allocated once;
    appends that do not fit raise DraftPoolFull without changing anything)."""

    method = "eagle"
    needs_hidden = True

    @property
    def hidden_size(self) -> int:
        """Width of the target hidden rows this drafter reads (advertised in DraftInfo)."""
        return self.head.hidden_size

    @property
    def vocab_size(self) -> int:
        """The target vocabulary its trees' ids come from (advertised in DraftInfo)."""
        return self.head.config.target.vocab_size

    def __init__(
        self,
        head: EagleHead,
        shape: TreeShape,
        num_slots: int,
        max_batch_size: int = 32,
        max_requests: int = 512,
    ) -> None:
        if shape.topk > head.config.target.vocab_size or max_batch_size < 1:
            raise ValueError("need topk <= vocabulary size and max_batch_size >= 1")
        param = head.fc.weight
        self.head = head.eval()
        self.shape = shape
        self.max_batch_size = max_batch_size
        self.device, self.dtype = param.device, param.dtype
        num_scratch = max_batch_size * (shape.num_steps - 1) * shape.topk
        self.pool = DraftKVPool(
            head.config.target, len(head.layers), num_slots, num_scratch, param.dtype, param.device
        )
        target = head.config.target
        self.rows = DraftRows(
            max_requests, target.max_position, head.hidden_size, self.pool.dummy_slot,
            param.dtype, param.device,
        )  # fmt: skip
        self._requests: dict[str, RequestState] = {}
        self.search_graphs: SearchGraphRunner | None = None
        self.append_graphs: AppendGraphRunner | None = None
        self.clock = DeviceClock(self.device)
        self.pad_eager_appends = self.device.type == "cuda"  # eager_bucket: its cost is the host's
        # Eager steps on the paged attention (the CPU kernel), set by the factory where it loads.
        self.paged_eager = False

    # ---- Drafter interface ----------------------------------------------------------------

    def append(self, chunk: ContextChunk) -> None:
        if self.append_many([chunk]):
            raise ContextMismatch(f"request {chunk.request_id!r}: chunk does not continue context")

    def append_many(self, chunks: Sequence[ContextChunk]) -> list[str]:
        """Applies every chunk that lines up, running all their new pairs in one head forward.

        A chunk at start_pos 0 starts its request afresh (replacing held state). Returns the ids
        whose chunk did not line up; their state is left as it was. Raises ValueError on bad
        input and DraftPoolFull when the new pairs do not fit, in both cases changing nothing.
        """
        if len({c.request_id for c in chunks}) != len(chunks):
            raise ValueError("a request may appear once per append")
        for chunk in chunks:
            self._check_input(chunk)
        lines_up = [self._lines_up(c) for c in chunks]
        fits = [c for c, ok in zip(chunks, lines_up, strict=True) if ok]
        self._check_capacity(fits)
        with torch.inference_mode():
            for chunk in fits:
                if chunk.start_pos == 0:  # restarts free their slots before anyone allocates
                    self.release(chunk.request_id)
                    self._requests[chunk.request_id] = self._empty_state()
            work = [self._absorb(chunk) for chunk in fits]
            self._run_pairs([w for w in work if w.count > 0])
        return [c.request_id for c, ok in zip(chunks, lines_up, strict=True) if not ok]

    def propose(self, request_ids: Sequence[str]) -> list[DraftTree]:
        """One EAGLE-2 tree per request; raises ContextMismatch if one is unknown or not ready."""
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("a request may appear once per propose")
        states = [self._ready_state(rid) for rid in request_ids]
        trees = [DraftTree.root_only(st.token_ids[-1]) for st in states]
        drafting = [i for i, st in enumerate(states) if st.slots]
        for first in range(0, len(drafting), self.max_batch_size):
            group = drafting[first : first + self.max_batch_size]
            with torch.inference_mode():
                drafted = self._draft([states[i] for i in group])
            for i, tree in zip(group, drafted, strict=True):
                trees[i] = tree
        return trees

    def release(self, request_id: str) -> bool:
        state = self._requests.pop(request_id, None)
        if state is None:
            return False
        self.pool.free(state.slots)
        self.rows.free(state.row)
        return True

    def held_ids(self) -> list[str]:
        return list(self._requests)

    def num_tokens(self, request_id: str) -> int:
        state = self._requests.get(request_id)
        return len(state.token_ids) if state else 0

    def num_hidden_rows(self, request_id: str) -> int:
        state = self._requests.get(request_id)
        return state.num_rows if state else 0

    def is_ready(self, request_id: str) -> bool:
        """Whether propose can draft for the request (held, rows == tokens - 1)."""
        state = self._requests.get(request_id)
        return state is not None and state.ready

    # ---- append -----------------------------------------------------------------------------

    def _check_input(self, chunk: ContextChunk) -> None:
        vocab = self.head.config.target.vocab_size
        if any(not 0 <= t < vocab for t in chunk.token_ids):
            raise ValueError(f"request {chunk.request_id!r}: token id outside [0, {vocab})")
        hidden = chunk.hidden
        if hidden is not None and (hidden.dim() != 2 or hidden.shape[1] != self.head.hidden_size):
            raise ValueError(
                f"request {chunk.request_id!r}: hidden rows must be [rows, "
                f"{self.head.hidden_size}], got {list(hidden.shape)}"
            )
        end = chunk.start_pos + len(chunk.token_ids)
        if end + self.shape.num_steps > self.head.config.target.max_position:
            raise ValueError(f"request {chunk.request_id!r}: context {end} too long to draft")

    def _held_after(self, chunk: ContextChunk) -> tuple[RequestState | None, int, int]:
        """(state kept, tokens, rows) once the chunk is applied; the state is None on restart."""
        state = None if chunk.start_pos == 0 else self._requests.get(chunk.request_id)
        tokens = len(state.token_ids) if state else 0
        rows = state.num_rows if state else 0
        return state, tokens + len(chunk.token_ids), rows + num_rows(chunk)

    def _lines_up(self, chunk: ContextChunk) -> bool:
        state, tokens, rows = self._held_after(chunk)
        if chunk.start_pos != 0 and (state is None or chunk.start_pos != len(state.token_ids)):
            return False
        held_rows = state.num_rows if state else 0
        if num_rows(chunk) and chunk.hidden_start_pos != held_rows:
            return False
        return rows <= tokens  # a target row exists only for a token the target has run

    def _check_capacity(self, chunks: list[ContextChunk]) -> None:
        """Slots the chunks allocate must fit in the free ones plus those restarts give back,
        and each new request needs a table row."""
        needed, freed, new_rows = 0, 0, 0
        for chunk in chunks:
            state, tokens, rows = self._held_after(chunk)
            needed += max(0, min(rows, tokens - 1)) - (len(state.slots) if state else 0)
            held = self._requests.get(chunk.request_id)
            if state is None and held is not None:
                freed += len(held.slots)
            new_rows += state is None and held is None
        if needed > self.pool.num_free + freed:
            raise DraftPoolFull(
                f"draft KV pool: {needed} slots wanted, {self.pool.num_free + freed} free"
            )
        if new_rows > self.rows.num_free:
            raise DraftPoolFull(
                f"draft request table: {new_rows} rows wanted, {self.rows.num_free} free"
            )

    def _absorb(self, chunk: ContextChunk) -> PairWork:
        """Adds the chunk to the request's state; returns the pairs that became runnable."""
        state = self._requests[chunk.request_id]
        state.token_ids.extend(int(t) for t in chunk.token_ids)
        if num_rows(chunk):
            assert chunk.hidden is not None
            # Kept on the host: the append moves a step's rows to the device in one copy.
            rows = chunk.hidden.to(device="cpu", dtype=self.dtype)
            state.pending = torch.cat([state.pending, rows]) if len(state.pending) else rows
            state.num_rows += rows.shape[0]
        start = len(state.slots)
        count = max(0, min(state.num_rows, len(state.token_ids) - 1)) - start
        return PairWork(state, start, count, self.pool.allocate(count))

    def _empty_state(self) -> RequestState:
        empty_rows = torch.empty((0, self.head.hidden_size), dtype=self.dtype)
        return RequestState([], 0, empty_rows, [], self.rows.allocate())

    def _run_pairs(self, work: list[PairWork]) -> None:
        """One causal head forward over the new pairs of every request (prefill or extend):
        their slots go into the requests' table rows, the last pair's feature into the
        feature table."""
        if not work:
            return
        runner = self.append_graphs
        if runner is not None and runner.can_run([w.count for w in work]):
            runner.run([new_pairs(w) for w in work])
        else:
            with self.clock.region():
                pad, paged = self.pad_eager_appends, self.paged_eager
                run_pairs_eagerly(self.head, self.pool, self.rows, work, pad, paged)
        for w in work:
            w.state.pending = w.state.pending[w.count :]
            w.state.slots.extend(w.slots)

    # ---- propose ----------------------------------------------------------------------------

    def _ready_state(self, request_id: str) -> RequestState:
        state = self._requests.get(request_id)
        if state is None or not state.ready:
            raise ContextMismatch(f"request {request_id!r}: no complete context held")
        return state

    def attach_graphs(self, search: SearchGraphRunner, append: AppendGraphRunner) -> None:
        """Proposes and round appends that fit the runners' buckets run their fixed-shape
        steps from now on."""
        self.search_graphs, self.append_graphs = search, append
        search.clock = append.clock = self.clock

    def take_device_ms(self) -> float:
        return self.clock.take_ms()

    def _draft(self, states: list[RequestState]) -> list[DraftTree]:
        """Search, rerank and bring the trees to the host (the propose's one sync)."""
        runner = self.search_graphs
        if runner is not None and runner.can_run(len(states)):
            found = runner.run([st.row for st in states], [len(st.slots) for st in states])
        else:
            with self.clock.region():
                found = self._search(states)
        return [
            DraftTree([st.token_ids[-1], *t], [-1, *p], [1.0, *s])
            for st, t, p, s in zip(states, found.tokens, found.parents, found.scores, strict=True)
        ]

    def _search(self, states: list[RequestState]) -> Proposals:
        inputs = self._search_inputs(states)
        candidates = search_tree(self.head, self.pool.kv, inputs, self.shape)
        tokens, parents, scores = rerank(candidates, self.shape.num_draft_tokens - 1)
        token_lists, parent_lists = torch.stack([tokens, parents]).tolist()
        return Proposals(token_lists, parent_lists, scores.clamp(0.0, 1.0).tolist())

    def _search_inputs(self, states: list[RequestState]) -> SearchInputs:
        width = (self.shape.num_steps - 1) * self.shape.topk
        scratch = self.pool.scratch[: len(states) * width].view(len(states), width)
        rows = torch.tensor([st.row for st in states], device=self.device)
        lens = torch.tensor([len(st.slots) for st in states], device=self.device)
        common = {"root_features": self.rows.features[rows], "context_lens": lens,
                  "scratch_slots": scratch}  # fmt: skip
        if self.paged_eager:
            return SearchInputs(**common, table=self.rows.slots, table_rows=rows)
        # Columns past a request's length hold old slots: the masks never admit them.
        context = self.rows.slots[rows, : max(len(st.slots) for st in states)]
        return SearchInputs(**common, context_slots=context)
