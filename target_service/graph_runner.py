"""Decode steps with fixed shapes, replayed from CUDA graphs (eager with the same code on CPU).

A decode step (one new token per request) runs over static buffers sized for the largest
bucket: B requests padded up to a batch bucket. Padded requests write their KV and hidden row to
the dummy slot and read only the dummy slot, so no padded row can touch a live slot. One graph
is captured per (batch bucket, context bucket, mode), largest first into one shared memory
pool. The modes: greedy ids, sampled ids, or the step's fp32 logits left in a static buffer
for the engine to change and sample from (penalties, logit_bias, structured output's masks:
what the graphs cannot do themselves; ``run_logits``). The engine asks ``can_run`` and falls
back to its eager step for anything else (prefill chunks, mixed steps, shapes past the
largest bucket).

With the paged attention backend (model_runtime/paged.py) the graph reads the engine's slot
table itself, so the context length is only a bound checked on the host: one context bucket.
With the torch backend each request's keys are copied into a [B, K] buffer padded up to a
context bucket K (powers of two from 256) and masked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from model_runtime.attention import AttentionMetadata
from model_runtime.cuda_graphs import bucket_for, capture_shapes, replay_or_run
from model_runtime.device_clock import DeviceClock
from model_runtime.llama import LlamaForCausalLM
from model_runtime.paged import PagedMetadata
from model_runtime.pools import SlotPools
from model_runtime.sampling import SamplingTensors, sample_greedy_or_drawn
from target_service.config import DECODE_GRAPH_BATCHES

log = logging.getLogger("splitspec.target")

MIN_CONTEXT_BUCKET = 256
GREEDY, SAMPLED, LOGITS = "greedy", "sampled", "logits"  # what a graph leaves behind


def context_buckets(max_context: int) -> tuple[int, ...]:
    """Powers of two from MIN_CONTEXT_BUCKET up to (and including) one >= max_context."""
    buckets = [MIN_CONTEXT_BUCKET]
    while buckets[-1] < max_context:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


@dataclass
class DecodeBuffers:
    """Static inputs and outputs of a decode step, sized [max_batch] / [max_batch, max_keys]."""

    input_ids: torch.Tensor  # long
    positions: torch.Tensor  # long: the new token's position (= context length before it)
    write_slots: torch.Tensor  # long: its KV slot; the dummy slot for padded rows
    key_slots: torch.Tensor  # long [B, K]: context slots, the dummy slot past each (torch)
    allowed: torch.Tensor  # bool [B, 1, 1, K] (torch)
    rows: torch.Tensor  # long [B]: arange, the query/token index of each row
    table_rows: torch.Tensor  # long [B]: slot-table row of each request (paged)
    prefix_len: torch.Tensor  # long [B]: keys read from the table, 0 for padding (paged)
    path: torch.Tensor  # long [B, 1]: the dummy slot, the key padding rows read (paged)
    temperature: torch.Tensor  # float32
    top_p: torch.Tensor  # float32
    top_k: torch.Tensor  # long
    seed: torch.Tensor  # long
    min_p: torch.Tensor  # float32; 0: off
    next_ids: torch.Tensor  # long: output
    logits: torch.Tensor  # float32 [B, V]: output of the LOGITS graphs

    @staticmethod
    def allocate(
        max_batch: int, max_keys: int, dummy_slot: int, device: torch.device, vocab: int
    ) -> DecodeBuffers:
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        return DecodeBuffers(
            input_ids=longs(max_batch),
            positions=longs(max_batch),
            write_slots=longs(max_batch),
            key_slots=longs(max_batch, max_keys),
            allowed=torch.zeros((max_batch, 1, 1, max_keys), dtype=torch.bool, device=device),
            rows=torch.arange(max_batch, device=device),
            table_rows=longs(max_batch),
            prefix_len=longs(max_batch),
            path=torch.full((max_batch, 1), dummy_slot, dtype=torch.long, device=device),
            temperature=torch.zeros(max_batch, device=device),
            top_p=torch.ones(max_batch, device=device),
            top_k=longs(max_batch),
            seed=longs(max_batch),
            min_p=torch.zeros(max_batch, device=device),
            next_ids=longs(max_batch),
            logits=torch.zeros((max_batch, vocab), dtype=torch.float32, device=device),
        )


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step on the device, unpadded: R requests."""

    input_ids: torch.Tensor  # [R]
    positions: torch.Tensor  # [R]
    write_slots: torch.Tensor  # [R]
    table_rows: torch.Tensor  # [R] slot-table row of each request
    max_context: int  # the longest context + 1, known on the host
    sampling: SamplingTensors | None  # [R]; None when every request is greedy
    key_slots: torch.Tensor | None = None  # [R, C], C >= max_context (torch backend only)

    @property
    def greedy(self) -> bool:
        return self.sampling is None


class DecodeGraphRunner:
    """Owns the static decode buffers and the captured graphs of one engine."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        pools: SlotPools,
        max_context: int,
        batch_buckets: tuple[int, ...] = DECODE_GRAPH_BATCHES,
        use_graphs: bool = True,
        table: torch.Tensor | None = None,
    ) -> None:
        """``table``: the engine's slot table, for the paged backend; None for torch's."""
        self.model = model
        self.pools = pools
        self.device = pools.hidden.device
        self.table = table
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.context_buckets = (max_context,) if table is not None else context_buckets(max_context)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        key_width = 1 if table is not None else self.context_buckets[-1]
        self.buffers = DecodeBuffers.allocate(
            self.batch_buckets[-1], key_width, pools.dummy_slot, self.device,
            model.config.vocab_size,
        )  # fmt: skip
        self.graphs: dict[tuple[int, int, str], torch.cuda.CUDAGraph] = {}
        self.clock: DeviceClock | None = None  # set by the engine that attaches the runner
        self._dirty_rows = self.batch_buckets[-1]  # rows [0, this) may hold a past step's data
        self._reset_padding(0)

    def captured_batches(self) -> list[int]:
        """Batch buckets with captured graphs (empty when graphs are off)."""
        return sorted({batch for batch, _, _ in self.graphs})

    def can_run(self, num_requests: int, max_positions: int) -> bool:
        return (
            bucket_for(num_requests, self.batch_buckets) is not None
            and bucket_for(max_positions, self.context_buckets) is not None
        )

    def capture_all(self) -> None:
        """Captures every bucket, largest first (so smaller graphs reuse its pool memory)."""
        if not self.use_graphs:
            return
        shapes = [
            (b, k, mode)
            for b in reversed(self.batch_buckets)
            for k in reversed(self.context_buckets)
            for mode in (GREEDY, SAMPLED, LOGITS)
        ]
        self.graphs = capture_shapes(shapes, "decode", self.device, self._body)
        log.info("decode graphs: batch %s x context %s", self.batch_buckets, self.context_buckets)

    def run(self, step: DecodeInputs) -> torch.Tensor:
        """Next token ids [R] on the device (the caller makes the one host copy)."""
        self._replay(step, GREEDY if step.greedy else SAMPLED)
        return self.buffers.next_ids[: step.input_ids.shape[0]].clone()

    def run_logits(self, step: DecodeInputs) -> torch.Tensor:
        """The step's fp32 logits [R, V]: a view of the static buffer, valid until the next
        replay (the caller samples from it first)."""
        self._replay(step, LOGITS)
        return self.buffers.logits[: step.input_ids.shape[0]]

    def _replay(self, step: DecodeInputs, mode: str) -> None:
        batch = bucket_for(step.input_ids.shape[0], self.batch_buckets)
        keys = bucket_for(step.max_context, self.context_buckets)
        assert batch is not None and keys is not None, "check can_run first"
        self._load(step, keys)
        replay_or_run(self.graphs, (batch, keys, mode), self._body, self.clock)

    # ---- the fixed-shape step ---------------------------------------------------------

    def _body(self, batch: int, keys: int, mode: str) -> None:
        buf = self.buffers
        write_slots = buf.write_slots[:batch]
        positions = buf.positions[:batch]
        hidden = self.model(
            buf.input_ids[:batch], positions, (self.pools.k, self.pools.v), self._meta(batch, keys)
        )
        self.pools.hidden.index_copy_(0, write_slots, hidden)
        if mode == GREEDY:
            self.model.greedy_ids(hidden, out=buf.next_ids[:batch])
            return
        if mode == LOGITS:
            buf.logits[:batch].copy_(self.model.logits(hidden))
            return
        logits = self.model.logits(hidden)
        params = SamplingTensors(
            buf.temperature[:batch],
            buf.top_p[:batch],
            buf.top_k[:batch],
            buf.seed[:batch],
            positions + 1,
            buf.min_p[:batch],
        )
        buf.next_ids[:batch].copy_(sample_greedy_or_drawn(logits, params))

    def _meta(self, batch: int, keys: int) -> AttentionMetadata | PagedMetadata:
        buf = self.buffers
        if self.table is not None:
            return PagedMetadata(
                write_slots=buf.write_slots[:batch],
                table=self.table,
                query_row=buf.table_rows[:batch],
                query_len=buf.positions[:batch] + 1,
                prefix_len=buf.prefix_len[:batch],
                path=buf.path[:batch],
                max_keys=keys,  # the context bound: every replay's lengths fit under it
            )
        return AttentionMetadata(
            write_slots=buf.write_slots[:batch],
            query_index=buf.rows[:batch, None],
            key_slots=buf.key_slots[:batch, :keys],
            allowed=buf.allowed[:batch, :, :, :keys],
            token_rows=buf.rows[:batch],
        )

    def _load(self, step: DecodeInputs, keys: int) -> None:
        buf, num_req = self.buffers, step.input_ids.shape[0]
        self._reset_padding(num_req)  # rows a larger earlier step left behind
        buf.input_ids[:num_req].copy_(step.input_ids)
        buf.positions[:num_req].copy_(step.positions)
        buf.write_slots[:num_req].copy_(step.write_slots)
        if self.table is not None:
            buf.table_rows[:num_req].copy_(step.table_rows)
            torch.add(step.positions, 1, out=buf.prefix_len[:num_req])
        else:
            self._load_key_slots(step, keys)
        s = step.sampling
        if s is None:
            return
        for dst, src in (
            (buf.temperature, s.temperature),
            (buf.top_p, s.top_p),
            (buf.top_k, s.top_k),
            (buf.seed, s.seed),
            (buf.min_p, s.min_p),
        ):
            dst[:num_req].copy_(src)

    def _load_key_slots(self, step: DecodeInputs, keys: int) -> None:
        """Torch backend: each request's context slots, padded with the dummy slot and masked."""
        buf, num_req = self.buffers, step.input_ids.shape[0]
        assert step.key_slots is not None, "the torch backend needs the key slots"
        width = min(int(step.key_slots.shape[1]), keys)
        key_index = torch.arange(keys, device=self.device)
        visible = key_index[None, :] <= step.positions[:, None]  # [R, K]: the context + itself
        buf.allowed[:num_req, 0, 0, :keys].copy_(visible)
        context = buf.key_slots[:num_req, :keys]
        context.fill_(self.pools.dummy_slot)
        context[:, :width].copy_(step.key_slots[:, :width])
        context.masked_fill_(~visible, self.pools.dummy_slot)  # stale table columns never read

    def _reset_padding(self, start: int) -> None:
        """Rows [start, dirty) back to the padding state: the dummy slot, key 0 only, greedy.

        Only rows a past step filled are reset, so a run of same-size steps resets nothing.
        """
        end, self._dirty_rows = self._dirty_rows, start
        if start >= end:
            return
        buf, dummy, rows = self.buffers, self.pools.dummy_slot, slice(start, end)
        buf.input_ids[rows].zero_()
        buf.positions[rows].zero_()
        buf.write_slots[rows].fill_(dummy)
        buf.table_rows[rows].zero_()
        buf.prefix_len[rows].zero_()
        buf.key_slots[rows].fill_(dummy)
        buf.allowed[rows].zero_()
        buf.allowed[rows, :, :, 0] = True
        buf.temperature[rows].zero_()
        buf.top_p[rows].fill_(1.0)
        buf.top_k[rows].zero_()
        buf.min_p[rows].zero_()
