"""The EAGLE-2 tree search in fixed shapes, replayed from CUDA graphs (on CPU the same code runs
eagerly, which is how CI checks it).

A propose of B requests is padded to a batch bucket. Each request's context slots are copied
into a static table [bucket, W] (W = the longest context the drafter holds) that the paged
attention backend reads in place, so no shape follows the context lengths. A padded row has no
context (length 0) and a zero root feature: its nodes see only their own scratch slots, which
belong to that row alone. search_tree and rerank then run on the static inputs and leave the
kept tokens, parents and scores in one static buffer, which the host reads once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from draft_service.drafter import TreeShape
from draft_service.eagle.head import EagleHead
from draft_service.eagle.pool import DraftKVPool
from draft_service.eagle.tree_search import SearchInputs, rerank, search_tree
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock

log = logging.getLogger("splitspec.draft")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


@dataclass
class SearchBuffers:
    root_features: torch.Tensor  # [Bmax, H]
    context_lens: torch.Tensor  # long [Bmax]
    table: torch.Tensor  # long [Bmax, W]: context slots per row (only the first L are read)
    scratch: torch.Tensor  # long [Bmax, S * k]: each row's own tree-node slots (constant)
    packed: torch.Tensor  # float64 [Bmax, 3m]: kept tokens, parents, scores (m = kept nodes)


@dataclass
class Proposals:
    """Per request, the kept nodes in topological order (parents index the tree, root = 0)."""

    tokens: list[list[int]]
    parents: list[list[int]]
    scores: list[list[float]]


class SearchGraphRunner:
    def __init__(
        self,
        head: EagleHead,
        pool: DraftKVPool,
        shape: TreeShape,
        max_context: int,
        batch_buckets: tuple[int, ...] = BATCH_BUCKETS,
        use_graphs: bool = True,
    ) -> None:
        """``pool.scratch`` must hold (num_steps - 1) * topk slots for the largest bucket."""
        self.head, self.pool, self.shape = head, pool, shape
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.device = pool.k[0].device
        self.use_graphs = use_graphs and self.device.type == "cuda"
        num_candidates = shape.topk * (1 + (shape.num_steps - 1) * shape.topk)
        self.num_keep = min(shape.num_draft_tokens - 1, num_candidates)  # as rerank keeps
        self.buffers = self._allocate(self.batch_buckets[-1], max_context)
        self.graphs: dict[tuple[int], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner

    def _allocate(self, batch: int, width: int) -> SearchBuffers:
        nodes = (self.shape.num_steps - 1) * self.shape.topk
        if self.pool.scratch.numel() < batch * nodes:
            raise ValueError(f"the draft pool has scratch for fewer than {batch} requests")
        longs = dict(dtype=torch.long, device=self.device)
        return SearchBuffers(
            root_features=torch.zeros(
                (batch, self.head.hidden_size), dtype=self.pool.k[0].dtype, device=self.device
            ),
            context_lens=torch.zeros(batch, **longs),
            table=torch.full((batch, width), self.pool.dummy_slot, **longs),
            scratch=self.pool.scratch[: batch * nodes].view(batch, nodes),
            packed=torch.zeros((batch, 3 * self.num_keep), dtype=torch.float64, device=self.device),
        )

    @property
    def max_context(self) -> int:
        return self.buffers.table.shape[1]

    def can_run(self, num_requests: int, longest_context: int) -> bool:
        fits = bucket_for(num_requests, self.batch_buckets) is not None
        return fits and longest_context <= self.max_context

    def capture_all(self) -> None:
        """Captures every batch bucket, largest first, into one memory pool."""
        if not self.use_graphs:
            return
        self.buffers.context_lens.zero_()  # captured with every row padding
        shapes = [(b,) for b in reversed(self.batch_buckets)]
        self.graphs = capture_shapes(shapes, "draft search", self.device, self._body)
        log.info("draft search graphs: batch %s", self.batch_buckets)

    def run(
        self, root_features: list[torch.Tensor], context_slots: list[torch.Tensor]
    ) -> Proposals:
        """One tree per request from its root feature [H] and its context slots [L]."""
        count = len(root_features)
        batch = bucket_for(count, self.batch_buckets)
        assert batch is not None, "check can_run first"
        self._load(root_features, context_slots, batch)
        replay_or_run(self.graphs, (batch,), self._body, self.clock)
        rows = self.buffers.packed[:count].tolist()  # the propose's one device->host sync
        m = self.num_keep
        return Proposals(
            tokens=[[int(t) for t in row[:m]] for row in rows],
            parents=[[int(p) for p in row[m : 2 * m]] for row in rows],
            scores=[row[2 * m :] for row in rows],
        )

    def _load(self, features: list[torch.Tensor], slots: list[torch.Tensor], batch: int) -> None:
        buf, count = self.buffers, len(features)
        buf.root_features[:count].copy_(torch.stack(features))
        buf.root_features[count:batch].zero_()
        lengths = torch.tensor([s.numel() for s in slots] + [0] * (batch - count))
        buf.context_lens[:batch].copy_(lengths, non_blocking=True)
        padded = pad_sequence(slots, batch_first=True, padding_value=self.pool.dummy_slot)
        buf.table[:count, : padded.shape[1]].copy_(padded)

    def _body(self, batch: int) -> None:
        buf = self.buffers
        inputs = SearchInputs(
            root_features=buf.root_features[:batch],
            context_slots=buf.table[:batch],
            context_lens=buf.context_lens[:batch],
            scratch_slots=buf.scratch[:batch],
            paged=True,
        )
        candidates = search_tree(self.head, self.pool.kv, inputs, self.shape)
        tokens, parents, scores = rerank(candidates, self.num_keep)
        m = self.num_keep
        buf.packed[:batch, :m].copy_(tokens)
        buf.packed[:batch, m : 2 * m].copy_(parents)
        buf.packed[:batch, 2 * m :].copy_(scores.clamp(0.0, 1.0))
