"""A round's append in fixed shapes, replayed from CUDA graphs (on CPU the same code runs eagerly,
which is how CI checks it): the head forward over the few pairs each request gained from its
last verify (the accepted tokens with their target rows).

Each request's new pairs are padded to a fixed count P and the batch to a bucket. The step's
integers travel in one host->device copy and its hidden rows in another (model_runtime/
staging.py). Inside the step each real pair first writes its draft KV slot into its request's
row of the drafter's request table (rows.py), then attends to keys 0..t of that row (the new
slots included; the paged backend writes a step's K/V before it attends), as the eager
append's causal mask has it. A padding pair lives in the table's padding row: it writes the
dummy slot and reads one key, so nothing it computes reaches a real pair. The feature of each
request's last real pair (the next tree's root) goes to its row of the feature table.
Prefill-sized appends and larger batches run eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from draft_service.eagle.head import EagleHead
from draft_service.eagle.pool import DraftKVPool
from draft_service.eagle.rows import DraftRows
from draft_service.eagle.search_graphs import BATCH_BUCKETS
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock
from model_runtime.paged import PagedMetadata
from model_runtime.staging import Staging

log = logging.getLogger("splitspec.draft")


@dataclass
class NewPairs:
    """One request's pairs to run: pair t reads token x_{t+1} and target row h_t."""

    token_ids: list[int]  # x_{t+1} for t = start .. start + count - 1
    start: int
    slots: list[int]  # the draft KV slot each pair writes
    hidden: torch.Tensor  # [count, H] on the host, in the head's dtype
    row: int  # the request's row of the drafter's request table


INT_FIELDS = ("ids", "positions", "slots", "keys", "pair_rows")  # [B, P] each


class AppendGraphRunner:
    def __init__(
        self,
        head: EagleHead,
        pool: DraftKVPool,
        rows: DraftRows,
        pairs_per_request: int = 8,
        batch_buckets: tuple[int, ...] = BATCH_BUCKETS,
        use_graphs: bool = True,
    ) -> None:
        self.head, self.pool, self.rows = head, pool, rows
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.pairs = pairs_per_request
        self.device = pool.k[0].device
        self.use_graphs = use_graphs and self.device.type == "cuda"
        batch, pairs = self.batch_buckets[-1], self.pairs
        fields: dict[str, tuple[int, ...]] = {name: (batch, pairs) for name in INT_FIELDS}
        # last: each request's last real pair; request_rows: its table row.
        fields |= {"last": (batch,), "request_rows": (batch,)}
        self.inputs = Staging(fields, torch.long, self.device)
        self.hidden = Staging({"rows": (batch, pairs, head.hidden_size)}, pool.k[0].dtype,
                              self.device)  # fmt: skip
        self.path = torch.full((batch * pairs, 1), pool.dummy_slot, dtype=torch.long,
                               device=self.device)  # fmt: skip
        self.graphs: dict[tuple[int], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner

    def can_run(self, counts: list[int]) -> bool:
        fits = bucket_for(len(counts), self.batch_buckets) is not None
        return fits and max(counts) <= self.pairs

    def capture_all(self) -> None:
        if not self.use_graphs:
            return
        self._load([], self.batch_buckets[-1])  # captured with every pair padding
        shapes = [(b,) for b in reversed(self.batch_buckets)]
        self.graphs = capture_shapes(shapes, "draft append", self.device, self._body)
        log.info("draft append graphs: batch %s x %d pairs", self.batch_buckets, self.pairs)

    def run(self, requests: list[NewPairs]) -> None:
        """Writes each request's new slots into its table row and its last pair's feature
        into its feature row."""
        batch = bucket_for(len(requests), self.batch_buckets)
        assert batch is not None, "check can_run first"
        self._load(requests, batch)
        replay_or_run(self.graphs, (batch,), self._body, self.clock)

    def _load(self, requests: list[NewPairs], batch: int) -> None:
        host = {name: view.numpy() for name, view in self.inputs.fill().items()}
        pad = self.rows.pad_row
        host["ids"][:batch] = 0
        host["positions"][:batch] = 0  # a padding pair: column 0 of the padding row
        host["slots"][:batch] = self.pool.dummy_slot
        host["keys"][:batch] = 1
        host["pair_rows"][:batch] = pad
        host["last"][:batch] = 0
        host["request_rows"][:batch] = pad
        hidden = self.hidden.fill()["rows"]
        for i, req in enumerate(requests):
            n = len(req.token_ids)
            host["ids"][i, :n] = req.token_ids
            host["positions"][i, :n] = range(req.start, req.start + n)
            host["slots"][i, :n] = req.slots
            host["keys"][i, :n] = range(req.start + 1, req.start + n + 1)
            host["pair_rows"][i, :n] = req.row
            host["last"][i] = n - 1
            host["request_rows"][i] = req.row
            hidden[i, :n].copy_(req.hidden)
        self.inputs.upload()
        # Only the batch's rows: the buffer is sized for the largest bucket (~0.6 MB in bf16),
        # and the copy runs on the device ahead of the replay.
        self.hidden.upload(batch * self.pairs * self.head.hidden_size)

    def _body(self, batch: int) -> None:
        tokens = batch * self.pairs
        view = self.inputs.views
        ids, positions, slots, keys, pair_rows = (
            view[name][:batch].reshape(tokens) for name in INT_FIELDS
        )
        # Before the forward: its attention reads each pair's own slot from the table row.
        self.rows.slots.index_put_((pair_rows, positions), slots)
        meta = PagedMetadata(
            write_slots=slots,
            table=self.rows.slots,
            query_row=pair_rows,
            query_len=keys,
            prefix_len=keys,
            path=self.path[:tokens],
            max_keys=self.rows.width,  # fixed: the grid must not follow the contexts
        )
        hidden = self.hidden.views["rows"][:batch].reshape(tokens, -1)
        out = self.head(ids, hidden, positions, self.pool.kv, meta).view(batch, self.pairs, -1)
        last = view["last"][:batch, None, None].expand(-1, 1, out.shape[-1])
        self.rows.features.index_copy_(0, view["request_rows"][:batch], out.gather(1, last)[:, 0])
