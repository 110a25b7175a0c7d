"""A round's append in fixed shapes, replayed from CUDA graphs (on CPU the same code runs eagerly,
which is how CI checks it): the head forward over the few pairs each request gained from its
last verify (the accepted tokens with their target rows).

Each request's new pairs are padded to a fixed count P and the batch to a bucket. A real pair at
position t reads keys 0..t of its request's row of a static context table (the new slots
included; the paged backend writes a step's K/V before it attends), as the eager append's
causal mask has it. A padding pair writes the dummy slot and reads one key, so nothing it
computes reaches a real pair. The feature of each request's last real pair (the next tree's
root) lands in a static buffer. Prefill-sized appends and larger batches run eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from draft_service.eagle.head import EagleHead
from draft_service.eagle.pool import DraftKVPool
from draft_service.eagle.search_graphs import BATCH_BUCKETS
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock
from model_runtime.paged import PagedMetadata

log = logging.getLogger("splitspec.draft")


@dataclass
class NewPairs:
    """One request's pairs to run: pair t reads token x_{t+1} and target row h_t."""

    token_ids: list[int]  # x_{t+1} for t = start .. start + count - 1
    start: int
    slots: list[int]  # the draft KV slot each pair writes
    hidden: torch.Tensor  # [count, H] on the device
    context_slots: torch.Tensor  # [start + count] slots of every pair so far, the new included


class AppendGraphRunner:
    def __init__(
        self,
        head: EagleHead,
        pool: DraftKVPool,
        max_context: int,
        pairs_per_request: int = 8,
        batch_buckets: tuple[int, ...] = BATCH_BUCKETS,
        use_graphs: bool = True,
    ) -> None:
        self.head, self.pool = head, pool
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.pairs = pairs_per_request
        self.device = pool.k[0].device
        self.use_graphs = use_graphs and self.device.type == "cuda"
        batch, width = self.batch_buckets[-1], max_context
        longs = dict(dtype=torch.long, device=self.device)
        # Rows: token ids, positions, write slots, keys per pair (position + 1; padding: 1).
        self.index = torch.zeros((4, batch, self.pairs), **longs)
        self.last = torch.zeros(batch, **longs)  # index of each request's last real pair
        self.hidden = torch.zeros(
            (batch, self.pairs, head.hidden_size), dtype=pool.k[0].dtype, device=self.device
        )
        self.table = torch.full((batch, width), pool.dummy_slot, **longs)
        self.features = torch.zeros_like(self.hidden[:, 0])
        self.row_of_pair = torch.arange(batch, device=self.device).repeat_interleave(self.pairs)
        self.path = torch.full((batch * self.pairs, 1), pool.dummy_slot, **longs)
        self.graphs: dict[tuple[int], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner

    def can_run(self, counts: list[int], longest_context: int) -> bool:
        fits = bucket_for(len(counts), self.batch_buckets) is not None
        return fits and max(counts) <= self.pairs and longest_context <= self.table.shape[1]

    def capture_all(self) -> None:
        if not self.use_graphs:
            return
        self._pad_from(0, self.batch_buckets[-1])  # captured with every pair padding
        shapes = [(b,) for b in reversed(self.batch_buckets)]
        self.graphs = capture_shapes(shapes, "draft append", self.device, self._body)
        log.info("draft append graphs: batch %s x %d pairs", self.batch_buckets, self.pairs)

    def run(self, requests: list[NewPairs]) -> torch.Tensor:
        """[n, H] features of each request's last new pair: a view of a buffer the next run
        overwrites (copy what is kept)."""
        count = len(requests)
        batch = bucket_for(count, self.batch_buckets)
        assert batch is not None, "check can_run first"
        self._load(requests, batch)
        replay_or_run(self.graphs, (batch,), self._body, self.clock)
        return self.features[:count]

    def _load(self, requests: list[NewPairs], batch: int) -> None:
        host = torch.zeros((4, batch, self.pairs), dtype=torch.long)
        host[2], host[3] = self.pool.dummy_slot, 1  # padding: the dummy slot, one key
        for i, req in enumerate(requests):
            n = len(req.token_ids)
            positions = torch.arange(req.start, req.start + n)
            host[0, i, :n] = torch.tensor(req.token_ids)
            host[1, i, :n] = positions
            host[2, i, :n] = torch.tensor(req.slots)
            host[3, i, :n] = positions + 1
            self.hidden[i, :n].copy_(req.hidden)
        lasts = [len(r.token_ids) - 1 for r in requests] + [0] * (batch - len(requests))
        self.index[:, :batch].copy_(host, non_blocking=True)
        self.last[:batch].copy_(torch.tensor(lasts), non_blocking=True)
        slots = pad_sequence(
            [r.context_slots for r in requests], batch_first=True,
            padding_value=self.pool.dummy_slot,
        )  # fmt: skip
        self.table[: len(requests), : slots.shape[1]].copy_(slots)

    def _pad_from(self, first: int, batch: int) -> None:
        self.index[:, first:batch].zero_()
        self.index[2, first:batch] = self.pool.dummy_slot
        self.index[3, first:batch] = 1
        self.last[first:batch].zero_()

    def _body(self, batch: int) -> None:
        tokens = batch * self.pairs
        ids, positions, slots, keys = (row[:batch].reshape(tokens) for row in self.index)
        meta = PagedMetadata(
            write_slots=slots,
            table=self.table[:batch],
            query_row=self.row_of_pair[:tokens],
            query_len=keys,
            prefix_len=keys,
            path=self.path[:tokens],
            max_keys=self.table.shape[1],  # fixed: the grid must not follow the contexts
        )
        hidden = self.hidden[:batch].reshape(tokens, -1)
        out = self.head(ids, hidden, positions, self.pool.kv, meta).view(batch, self.pairs, -1)
        last = self.last[:batch, None, None].expand(-1, 1, out.shape[-1])
        self.features[:batch].copy_(out.gather(1, last).squeeze(1))
