"""The EAGLE-2 tree search in fixed shapes, replayed from CUDA graphs (on CPU the same code runs
eagerly, which is how CI checks it).

A propose of B requests is padded to a batch bucket. The step's inputs are each request's row
of the drafter's request table (rows.py) and its context length, in one host->device copy: the
paged attention backend reads the context slots from the table in place and the root features
come from the feature table by row, so no shape follows the context lengths and nothing per
request is copied. A padded request has no context (length 0) and the padding row's feature:
its nodes see only their own scratch slots, which belong to that batch row alone. search_tree
and rerank then leave the kept tokens, parents and scores in one static buffer, which the host
reads once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from draft_service.drafter import TreeShape
from draft_service.eagle.head import EagleHead
from draft_service.eagle.pool import DraftKVPool
from draft_service.eagle.rows import DraftRows
from draft_service.eagle.tree_search import SearchInputs, rerank, search_tree
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock
from model_runtime.staging import Staging

log = logging.getLogger("splitspec.draft")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


@dataclass
class SearchBuffers:
    scratch: torch.Tensor  # long [Bmax, S * k]: each batch row's own tree-node slots (constant)
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
        rows: DraftRows,
        shape: TreeShape,
        batch_buckets: tuple[int, ...] = BATCH_BUCKETS,
        use_graphs: bool = True,
    ) -> None:
        """``pool.scratch`` must hold (num_steps - 1) * topk slots for the largest bucket."""
        self.head, self.pool, self.rows, self.shape = head, pool, rows, shape
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.device = pool.k[0].device
        self.use_graphs = use_graphs and self.device.type == "cuda"
        num_candidates = shape.topk * (1 + (shape.num_steps - 1) * shape.topk)
        self.num_keep = min(shape.num_draft_tokens - 1, num_candidates)  # as rerank keeps
        batch = self.batch_buckets[-1]
        self.buffers = self._allocate(batch)
        # request_rows: table row per batch row; lens: its context pairs (0: padding).
        self.inputs = Staging({"request_rows": (batch,), "lens": (batch,)}, torch.long,
                              self.device)  # fmt: skip
        self.graphs: dict[tuple[int], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner

    def _allocate(self, batch: int) -> SearchBuffers:
        nodes = (self.shape.num_steps - 1) * self.shape.topk
        if self.pool.scratch.numel() < batch * nodes:
            raise ValueError(f"the draft pool has scratch for fewer than {batch} requests")
        return SearchBuffers(
            scratch=self.pool.scratch[: batch * nodes].view(batch, nodes),
            packed=torch.zeros((batch, 3 * self.num_keep), dtype=torch.float64, device=self.device),
        )

    def can_run(self, num_requests: int) -> bool:
        return bucket_for(num_requests, self.batch_buckets) is not None

    def capture_all(self) -> None:
        """Captures every batch bucket, largest first, into one memory pool."""
        if not self.use_graphs:
            return
        self._load([], [], self.batch_buckets[-1])  # captured with every row padding
        shapes = [(b,) for b in reversed(self.batch_buckets)]
        self.graphs = capture_shapes(shapes, "draft search", self.device, self._body)
        log.info("draft search graphs: batch %s", self.batch_buckets)

    def run(self, request_rows: list[int], context_lens: list[int]) -> Proposals:
        """One tree per request from its table row (context slots, root feature) and its
        context length."""
        count = len(request_rows)
        batch = bucket_for(count, self.batch_buckets)
        assert batch is not None, "check can_run first"
        self._load(request_rows, context_lens, batch)
        replay_or_run(self.graphs, (batch,), self._body, self.clock)
        rows = self.buffers.packed[:count].tolist()  # the propose's one device->host sync
        m = self.num_keep
        return Proposals(
            tokens=[[int(t) for t in row[:m]] for row in rows],
            parents=[[int(p) for p in row[m : 2 * m]] for row in rows],
            scores=[row[2 * m :] for row in rows],
        )

    def _load(self, request_rows: list[int], context_lens: list[int], batch: int) -> None:
        host = {name: view.numpy() for name, view in self.inputs.fill().items()}
        count = len(request_rows)
        host["request_rows"][:count] = request_rows
        host["request_rows"][count:batch] = self.rows.pad_row
        host["lens"][:count] = context_lens
        host["lens"][count:batch] = 0
        self.inputs.upload()

    def _body(self, batch: int) -> None:
        buf, view = self.buffers, self.inputs.views
        request_rows = view["request_rows"][:batch]
        inputs = SearchInputs(
            root_features=self.rows.features[request_rows],
            context_lens=view["lens"][:batch],
            scratch_slots=buf.scratch[:batch],
            table=self.rows.slots,
            table_rows=request_rows,
        )
        candidates = search_tree(self.head, self.pool.kv, inputs, self.shape)
        tokens, parents, scores = rerank(candidates, self.num_keep)
        m = self.num_keep
        buf.packed[:batch, :m].copy_(tokens)
        buf.packed[:batch, m : 2 * m].copy_(parents)
        buf.packed[:batch, 2 * m :].copy_(scores.clamp(0.0, 1.0))
