"""Greedy tree-verify steps with fixed shapes, replayed from CUDA graphs (eagerly, with the same
code, on CPU, where the tests check it against the engine's own verify).

A verify step's B trees of up to N nodes are padded to a (batch bucket, tree bucket). Every
node of the padded block runs: padding nodes and padded requests get the dummy slot as their
KV slot (forced, never read from the table, whose freed rows keep old slots), position 0 or
their tree's root position, and see only themselves past their request's committed context,
so nothing they compute reaches a live slot. Tree mask, greedy acceptance and the compaction
of the accepted path are the device kernels of kernels/tree_ops.py; the result (accepted
tokens, count, next token) and the hidden rows land in static buffers, and the host reads
them once. Only the paged attention backend, greedy trees and requests without presence or
frequency penalties take this path; the engine runs everything else through run_verify.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kernels import tree_ops
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock
from model_runtime.llama import LlamaForCausalLM
from model_runtime.paged import for_trees
from model_runtime.pools import SlotPools
from target_service.verify import TreeBatch, VerifyOutput

log = logging.getLogger("splitspec.target")

BATCH_BUCKETS = (1, 2, 4, 8)  # speculation runs at small batches (see the router's switch)
TREE_BUCKETS = (8, 16, 32, 64)  # nodes per tree, root included


@dataclass
class VerifyBuffers:
    tokens: torch.Tensor  # long [B, N]
    parents: torch.Tensor  # long [B, N]; padding: child of the root
    valid: torch.Tensor  # bool [B, N]
    rows: torch.Tensor  # long [B]: slot-table row; 0 for padded requests (never written)
    start_pos: torch.Tensor  # long [B]: root position; 0 for padded requests
    packed: torch.Tensor  # long [B, N + 2]: path tokens, number accepted, next token
    hidden: torch.Tensor  # [B, N, H]: hidden rows of positions start .. start + N - 1

    @staticmethod
    def allocate(batch: int, nodes: int, width: int, dtype, device) -> VerifyBuffers:
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        return VerifyBuffers(
            tokens=longs(batch, nodes),
            parents=longs(batch, nodes),
            valid=torch.zeros((batch, nodes), dtype=torch.bool, device=device),
            rows=longs(batch),
            start_pos=longs(batch),
            packed=longs(batch, nodes + 2),
            hidden=torch.zeros((batch, nodes, width), dtype=dtype, device=device),
        )


class VerifyGraphRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        pools: SlotPools,
        table: torch.Tensor,
        batch_buckets: tuple[int, ...] = BATCH_BUCKETS,
        tree_buckets: tuple[int, ...] = TREE_BUCKETS,
        use_graphs: bool = True,
    ) -> None:
        """``table``: the engine's slot table (the paged backend reads it in place)."""
        self.model, self.pools, self.table = model, pools, table
        self.device = pools.hidden.device
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.tree_buckets = tuple(sorted(tree_buckets))
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.buffers = VerifyBuffers.allocate(
            self.batch_buckets[-1], self.tree_buckets[-1], pools.hidden.shape[-1],
            pools.hidden.dtype, self.device,
        )  # fmt: skip
        self.node_ids = torch.arange(self.tree_buckets[-1], device=self.device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner

    def can_run(self, num_trees: int, max_nodes: int) -> bool:
        return (
            bucket_for(num_trees, self.batch_buckets) is not None
            and bucket_for(max_nodes, self.tree_buckets) is not None
        )

    def capture_all(self) -> None:
        """Captures every (batch, tree) bucket, largest first, into one memory pool."""
        if not self.use_graphs:
            return
        shapes = [(b, n) for b in reversed(self.batch_buckets) for n in reversed(self.tree_buckets)]
        self._pad_from(0, 0)  # captured with every row padding: they write the dummy slot only
        self.graphs = capture_shapes(shapes, "verify", self.device, self._body)
        log.info("verify graphs: batch %s x tree nodes %s", self.batch_buckets, self.tree_buckets)

    def run(self, trees: TreeBatch, want_hidden: bool) -> VerifyOutput:
        num_trees, num_nodes = trees.tokens.shape
        batch = bucket_for(num_trees, self.batch_buckets)
        nodes = bucket_for(num_nodes, self.tree_buckets)
        assert batch is not None and nodes is not None, "check can_run first"
        self._load(trees)
        replay_or_run(self.graphs, (batch, nodes), self._body, self.clock)
        rows = self.buffers.packed[:num_trees, : nodes + 2].tolist()  # the step's one sync
        hidden = None
        if want_hidden:  # copy: on CPU .to("cpu") is a view of the buffer the next step reuses
            hidden = self.buffers.hidden[:num_trees, :num_nodes].to("cpu", copy=True)
        counts = [row[nodes] for row in rows]
        token_ids = [row[1 : 1 + n] + [row[nodes + 1]] for row, n in zip(rows, counts, strict=True)]
        return VerifyOutput(token_ids, counts, hidden)

    # ---- the fixed-shape step ---------------------------------------------------------

    def _load(self, trees: TreeBatch) -> None:
        buf = self.buffers
        num_trees, num_nodes = trees.tokens.shape
        self._pad_from(num_trees, num_nodes)
        buf.tokens[:num_trees, :num_nodes].copy_(trees.tokens)
        buf.parents[:num_trees, :num_nodes].copy_(trees.parents)
        buf.valid[:num_trees, :num_nodes].copy_(trees.valid)
        buf.rows[:num_trees].copy_(trees.rows)
        buf.start_pos[:num_trees].copy_(trees.start_pos)

    def _pad_from(self, num_trees: int, num_nodes: int) -> None:
        """Everything past the step's trees back to padding: invalid children of the root."""
        buf = self.buffers
        for t in (buf.tokens, buf.parents):
            t[num_trees:].zero_()
            t[:num_trees, num_nodes:].zero_()
        buf.valid[num_trees:].zero_()
        buf.valid[:num_trees, num_nodes:].zero_()
        buf.rows[num_trees:].zero_()
        buf.start_pos[num_trees:].zero_()

    def _body(self, batch: int, nodes: int) -> None:
        buf, dummy = self.buffers, self.pools.dummy_slot
        tokens, parents, valid = (t[:batch, :nodes] for t in (buf.tokens, buf.parents, buf.valid))
        rows, start = buf.rows[:batch], buf.start_pos[:batch]
        mask = tree_ops.tree_mask_and_positions(parents, valid, start)
        columns = (start[:, None] + self.node_ids[:nodes]).clamp(max=self.table.shape[1] - 1)
        node_slots = torch.where(valid, self.table[rows[:, None], columns], dummy)
        meta = for_trees(self.table, rows, start, node_slots, mask.ancestors, mask.depths, None)
        hidden = self.model(
            tokens.flatten(), mask.positions.flatten(), (self.pools.k, self.pools.v), meta
        )
        self.pools.hidden.index_copy_(0, meta.write_slots, hidden)
        target_next = self.model.greedy_ids(hidden).view(batch, nodes)
        accepted = tree_ops.greedy_accept_path(tokens, parents, valid, target_next)
        tree_ops.compact_accepted(self.pools.all_pools(), node_slots, accepted.path, dummy)
        path_tokens = tokens.gather(1, accepted.path.clamp(min=0))
        buf.packed[:batch, :nodes].copy_(path_tokens)
        buf.packed[:batch, nodes].copy_(accepted.num_accepted)
        buf.packed[:batch, nodes + 1].copy_(accepted.next_token)
        buf.hidden[:batch, :nodes].copy_(self.pools.hidden[node_slots])
