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
Structured output's trees (a mask per node, target_service/token_masks.py) have graphs of
their own up to batch MASKED_MAX_BATCH: the same step with the argmax taken over the masked
fp32 logits, the masks' words copied in beside the trees.

Host work around a replay is kept to copies. The host packs the whole padded block
(tree_batch.pack_trees, padding included) into a staging buffer, pinned on CUDA, and one
non_blocking copy moves it into the static input buffer whose views the graph reads; nothing
is zeroed or filled on the device. After the replay two non_blocking copies bring back the
ids and only the hidden rows the host can need (up to the deepest tree that asked for them),
then one stream sync. Each bucket reads and writes a prefix of every static buffer, laid out
for that bucket, so each of those copies is one contiguous block.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from kernels import tree_ops
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock
from model_runtime.llama import LlamaForCausalLM
from model_runtime.paged import for_trees
from model_runtime.pools import SlotPools
from target_service import token_masks
from target_service.config import VERIFY_GRAPH_BATCHES
from target_service.logprob_pass import Tops, committed_tokens, read_back, widest
from target_service.logprobs import device_pass, rows_needed
from target_service.tree_batch import (
    HostTrees,
    PackedTrees,
    pack_trees,
    packed_len,
    tree_depth,
    unpack,
)
from target_service.verify import VerifyOutput

log = logging.getLogger("splitspec.target")


def tree_buckets_up_to(max_tree_tokens: int) -> tuple[int, ...]:
    """Nodes per tree (root included): powers of two from 8 to the first at or past the
    target's largest tree."""
    buckets = [8]
    while buckets[-1] < max_tree_tokens:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


TREE_BUCKETS = tree_buckets_up_to(64)  # the target's default --max-tree-tokens
# Masked graphs hold [b * n, vocab] fp32 logits and int32 mask bits in their pool (50 MB each
# for 4 x 64 nodes of SmolLM2's 49,152 tokens, by size, not measured): kept to the batches one
# user's constrained requests make; larger masked batches verify eagerly.
MASKED_MAX_BATCH = 4


@dataclass
class StepBuffers:
    """Flat buffers sized for the largest bucket. The device's are the graphs' static inputs and
    outputs; the host's twins (pinned on CUDA) are what the copies go through."""

    inputs: torch.Tensor  # long: tree_batch.pack_trees' layout
    ids: torch.Tensor  # long: [b, n + 2] per bucket: path tokens, number accepted, next token
    hidden: torch.Tensor  # [n, b, H] per bucket: row j of every tree, so rows < d are a prefix

    @staticmethod
    def allocate(
        batch: int, nodes: int, width: int, dtype: torch.dtype, device: torch.device, pin: bool
    ) -> StepBuffers:
        def zeros(size: int, of: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=of, device=device, pin_memory=pin)

        return StepBuffers(
            inputs=zeros(packed_len(batch, nodes), torch.long),
            ids=zeros(batch * (nodes + 2), torch.long),
            hidden=zeros(nodes * batch * width, dtype),
        )


class BucketViews(NamedTuple):
    """One bucket's (b, n) prefixes of the device buffers and of their host twins."""

    inputs: torch.Tensor  # device, long [b * (3n + 2)]
    host_inputs: torch.Tensor
    host_inputs_np: np.ndarray  # the same memory as host_inputs, written by the host
    trees: PackedTrees  # views of ``inputs``: what the step's body reads
    ids: torch.Tensor  # device, long [b, n + 2]
    host_ids: torch.Tensor
    host_ids_np: np.ndarray  # the same memory as host_ids, read by the host
    hidden: torch.Tensor  # device [n, b, H]
    host_hidden: torch.Tensor

    @staticmethod
    def of(
        device: StepBuffers, host: StepBuffers, batch: int, nodes: int, width: int
    ) -> BucketViews:
        num_inputs, num_hidden = packed_len(batch, nodes), nodes * batch * width
        ids_shape, hidden_shape = (batch, nodes + 2), (nodes, batch, width)
        host_ids = host.ids[: batch * (nodes + 2)].view(ids_shape)
        return BucketViews(
            inputs=device.inputs[:num_inputs],
            host_inputs=host.inputs[:num_inputs],
            host_inputs_np=host.inputs[:num_inputs].numpy(),
            trees=unpack(device.inputs, batch, nodes),
            ids=device.ids[: batch * (nodes + 2)].view(ids_shape),
            host_ids=host_ids,
            host_ids_np=host_ids.numpy(),
            hidden=device.hidden[:num_hidden].view(hidden_shape),
            host_hidden=host.hidden[:num_hidden].view(hidden_shape),
        )


class VerifyGraphRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        pools: SlotPools,
        table: torch.Tensor,
        batch_buckets: tuple[int, ...] = VERIFY_GRAPH_BATCHES,
        tree_buckets: tuple[int, ...] = TREE_BUCKETS,
        use_graphs: bool = True,
    ) -> None:
        """``table``: the engine's slot table (the paged backend reads it in place)."""
        self.model, self.pools, self.table = model, pools, table
        self.device = pools.hidden.device
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.tree_buckets = tuple(sorted(tree_buckets))
        self.use_graphs = use_graphs and self.device.type == "cuda"
        sizes = (self.batch_buckets[-1], self.tree_buckets[-1], pools.hidden.shape[-1])
        on_cuda = self.device.type == "cuda"
        self.buffers = StepBuffers.allocate(*sizes, pools.hidden.dtype, self.device, pin=False)
        self.staging = StepBuffers.allocate(
            *sizes, pools.hidden.dtype, torch.device("cpu"), pin=on_cuda
        )
        self.views = {
            (b, n): BucketViews.of(self.buffers, self.staging, b, n, sizes[2])
            for b in self.batch_buckets
            for n in self.tree_buckets
        }
        self.node_ids = torch.arange(self.tree_buckets[-1], device=self.device)
        self.masks = token_masks.MaskBuffers(
            model.config.vocab_size, sizes[0] * sizes[1], self.device
        )
        self.graphs: dict[tuple[int, int, bool], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner

    def can_run(self, num_trees: int, max_nodes: int, masked: bool = False) -> bool:
        batch = bucket_for(num_trees, self.batch_buckets)
        return (
            batch is not None
            and bucket_for(max_nodes, self.tree_buckets) is not None
            and not (masked and batch > MASKED_MAX_BATCH)
        )

    def masked_graph_batch(self) -> int:
        """Most trees a greedy masked verify may have and still replay a graph (0: none)."""
        if not self.use_graphs:
            return 0
        return max((b for b in self.batch_buckets if b <= MASKED_MAX_BATCH), default=0)

    def capture_all(self) -> None:
        """Captures every (batch, tree) bucket, largest first, into one memory pool."""
        if not self.use_graphs:
            return
        shapes = [
            (b, n, masked)
            for b in reversed(self.batch_buckets)
            for n in reversed(self.tree_buckets)
            for masked in (False, True)
            if not (masked and b > MASKED_MAX_BATCH)
        ]
        self.buffers.inputs.zero_()  # captured with every row padding: they write the dummy slot
        self.graphs = capture_shapes(shapes, "verify", self.device, self._body)
        log.info("verify graphs: batch %s x tree nodes %s", self.batch_buckets, self.tree_buckets)

    def run(
        self,
        trees: HostTrees,
        want_hidden: list[bool],
        want_logprobs: Tops | None = None,
        masks: list[bytes] | None = None,
    ) -> VerifyOutput:
        """``hidden``: for the trees ``want_hidden`` marks, rows 0 .. their depth (so at least
        0 .. num_accepted); None when none does. ``want_logprobs``: per tree, None or the
        number of likeliest tokens its request wants beside its committed tokens' logprobs
        (None: no request asked). ``masks``: per tree, its nodes' allowed-token masks (empty:
        none); None when no tree has any."""
        num_trees, num_nodes = trees.shape
        batch = bucket_for(num_trees, self.batch_buckets)
        nodes = bucket_for(num_nodes, self.tree_buckets)
        assert batch is not None and nodes is not None, "check can_run first"
        view = self.views[batch, nodes]
        view.host_inputs_np[:] = pack_trees(trees, batch, nodes)
        # One stream: the copy lands before the replay reads the buffer. Its host side is free to
        # rewrite here because the last run synced after its own copy.
        view.inputs.copy_(view.host_inputs, non_blocking=True)
        if masks is not None:
            self.masks.load(masks, [len(t) for t in trees.token_ids], batch, nodes)
        replay_or_run(self.graphs, (batch, nodes, masks is not None), self._body, self.clock)
        asked = want_logprobs  # None when no request asked
        # Launched before the sync: the host's launches overlap the replay's device time.
        packed = self._launch_logprobs(view, nodes, trees, asked) if asked else None
        host_rows = self._copy_back(view, _rows_wanted(trees, want_hidden))
        rows = view.host_ids_np[:num_trees].tolist()
        counts = [row[nodes] for row in rows]
        token_ids = [row[1 : 1 + n] + [row[nodes + 1]] for row, n in zip(rows, counts, strict=True)]
        logprobs = read_back(packed, asked, [n + 1 for n in counts])
        return VerifyOutput(token_ids, counts, _tree_major(host_rows, num_trees), logprobs)

    def _launch_logprobs(
        self, view: BucketViews, nodes: int, trees: HostTrees, asked: Tops
    ) -> torch.Tensor:
        """Rows 0 .. R - 1 of every tree, R the deepest asking tree's depth + 1: after the
        compaction row j is position start + j, and it chose path token j + 1, or at j = the
        accepted count the next token. Packed [trees * R, ...] (logprobs.device_pass)."""
        num_trees = len(asked)
        depth = rows_needed(trees.parents, asked)
        ids = view.ids[:num_trees]
        tokens = committed_tokens(ids[:, :nodes], ids[:, nodes], ids[:, nodes + 1], depth)
        hidden = view.hidden[:depth, :num_trees].transpose(0, 1).reshape(-1, view.hidden.shape[-1])
        return device_pass(self.model, hidden, tokens.reshape(-1), widest(asked))

    def _copy_back(self, view: BucketViews, num_rows: int) -> torch.Tensor | None:
        """The ids and hidden rows 0 .. num_rows - 1 of every tree into the host buffers, then
        the step's one device->host sync. The host's rows [num_rows, b, H], or None."""
        view.host_ids.copy_(view.ids, non_blocking=True)
        host_rows = None
        if num_rows:
            host_rows = view.host_hidden[:num_rows]
            host_rows.copy_(view.hidden[:num_rows], non_blocking=True)
        if self.device.type == "cuda":  # non_blocking into pinned memory: wait before reading
            torch.cuda.current_stream(self.device).synchronize()
        return host_rows

    # ---- the fixed-shape step ---------------------------------------------------------

    def _body(self, batch: int, nodes: int, masked: bool) -> None:
        view, dummy = self.views[batch, nodes], self.pools.dummy_slot
        tokens, parents, real, rows, start = view.trees
        valid = real != 0  # long 0/1 in the packed inputs, so that one copy carries them
        mask = tree_ops.tree_mask_and_positions(parents, valid, start)
        columns = (start[:, None] + self.node_ids[:nodes]).clamp(max=self.table.shape[1] - 1)
        node_slots = torch.where(valid, self.table[rows[:, None], columns], dummy)
        meta = for_trees(self.table, rows, start, node_slots, mask.ancestors, mask.depths, None)
        hidden = self.model(
            tokens.flatten(), mask.positions.flatten(), (self.pools.k, self.pools.v), meta
        )
        self.pools.hidden.index_copy_(0, meta.write_slots, hidden)
        if masked:  # the argmax eager verify takes: over the masked fp32 logits
            keep = self.masks.keep(batch * nodes)
            logits = self.model.logits(hidden).masked_fill(~keep, float("-inf"))
            target_next = logits.argmax(-1).view(batch, nodes)
        else:
            target_next = self.model.greedy_ids(hidden).view(batch, nodes)
        accepted = tree_ops.greedy_accept_path(tokens, parents, valid, target_next)
        tree_ops.compact_accepted(self.pools.all_pools(), node_slots, accepted.path, dummy)
        view.ids[:, :nodes].copy_(tokens.gather(1, accepted.path.clamp(min=0)))
        view.ids[:, nodes].copy_(accepted.num_accepted)
        view.ids[:, nodes + 1].copy_(accepted.next_token)
        view.hidden.copy_(self.pools.hidden[node_slots.t()])  # node-major: see StepBuffers


def _rows_wanted(trees: HostTrees, want_hidden: list[bool]) -> int:
    """Hidden rows to bring back per tree: the accepted path of the deepest tree that asks."""
    wanted = (p for p, want in zip(trees.parents, want_hidden, strict=True) if want)
    return max((tree_depth(p) + 1 for p in wanted), default=0)


def _tree_major(host_rows: torch.Tensor | None, num_trees: int) -> torch.Tensor | None:
    """[num_trees, rows, H] of the host's node-major rows, in memory of its own: the host
    rows are the next step's buffer (a view of them could change under the caller)."""
    if host_rows is None:
        return None
    trees = host_rows[:, :num_trees].transpose(0, 1)
    return trees.clone(memory_format=torch.contiguous_format)
