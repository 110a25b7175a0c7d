"""The target engine: one batched forward per step over prefill chunks and decode tokens."""

from __future__ import annotations

import time

import torch

from model_runtime import fused, paged
from model_runtime.attention import AttentionMetadata, build_metadata
from model_runtime.device_clock import DeviceClock
from model_runtime.llama import LlamaForCausalLM
from model_runtime.pools import SlotPools
from model_runtime.sampling import SamplingTensors, sample_greedy_or_drawn
from target_service import penalties, token_masks
from target_service.admission import StepItem, StepLimits, VerifyItem, admit_step, admit_trees
from target_service.changed_logits import changes_logits, sample_changed
from target_service.config import TargetConfig
from target_service.device_batch import DeviceBatch, build_device_batch
from target_service.errors import InvalidStep
from target_service.graph_runner import DecodeGraphRunner, DecodeInputs
from target_service.logprob_pass import TokenLogprobs, Tops, read_back, widest
from target_service.logprobs import asked_tops, decode_pass, rows_needed
from target_service.multi_step import run_decode_steps
from target_service.prompt_scores import ScorePlan, plan_scores, read_scores, score_pass
from target_service.request_table import RequestState, RequestTable
from target_service.sampling_tensors import decode_sampling, sampling_tensors
from target_service.step_results import StepResult, VerifyStep, verify_results
from target_service.tree_batch import HostTrees, pad_trees
from target_service.verify import TreeBatch, VerifyOutput, run_verify
from target_service.verify_graphs import VerifyGraphRunner

Answers = list[TokenLogprobs | None] | None  # per item, where a request asked (logprob_pass.py)


class TargetEngine:
    def __init__(self, config: TargetConfig, model: LlamaForCausalLM) -> None:
        self.config = config
        self.model = model
        self.model_config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_context = min(config.max_context, model.config.max_position)
        self.pools = SlotPools(model.config, config.num_slots, self.dtype, self.device)
        width = self.max_context + config.max_lookahead
        self.table = RequestTable(config.max_requests, width, config.num_slots, self.device)
        self.graphs: DecodeGraphRunner | None = None
        self.verify_graphs: VerifyGraphRunner | None = None
        self.clock = DeviceClock(self.device)  # the graph runners' replays, the eager steps
        self.limits = StepLimits(
            config.max_batch_tokens, self.max_context, model.config.vocab_size,
            model.config.max_position, config.max_tree_tokens, config.max_decode_steps,
        )  # fmt: skip
        self.paged = config.paged_metadata
        if self.paged and self.device.type == "cpu":  # kernels/exact_attention.h
            auto = config.attention == "auto"
            self.paged = paged.load_cpu_kernel(config.cache_dir, auto, self.dtype)
        elif self.paged:
            flashinfer = config.attention_backend == "flashinfer"
            paged.use_cuda_kernel("flashinfer" if flashinfer else "triton")

    # ---- public API -------------------------------------------------------------------

    def forward(self, items: list[StepItem], decode_steps: int = 1) -> StepResult:
        """One step, or ``decode_steps`` > 1 decode steps back to back (multi_step.py): then
        K ids per item, item-major."""
        started = time.perf_counter()
        states = admit_step(self.table, self.limits, items, decode_steps)
        batch = build_device_batch(items, states, self.device)
        scores = plan_scores(items, states, self.device)  # prompt log-probabilities
        scored = None
        masks = [it.allowed_tokens for it in items if it.sample]  # structured output's
        changed = changes_logits(states, masks)
        with torch.inference_mode():
            plain = not (scores or changed)
            on_device = self._decoded_on_device(batch, states, decode_steps) if plain else None
            if on_device is not None:
                next_ids, logprobs = self._read_decoded(batch, states, on_device)
            elif not scores and decode_steps == 1 and self._fits_decode_graphs(batch, states):
                next_ids, logprobs = self._changed_decode(batch, states, masks)
            else:
                sampled = [states[i] for i, it in enumerate(items) if it.sample]
                with self.clock.region():
                    next_ids, logprobs, scored = self._run(batch, sampled, scores, masks)
        wall_ms = (time.perf_counter() - started) * 1e3
        return StepResult(next_ids, wall_ms, self.clock.take_ms(), logprobs, scored)

    def _decoded_on_device(
        self, batch: DeviceBatch, states: list[RequestState], steps: int
    ) -> torch.Tensor | None:
        """Decode steps with no host work between them (K steps, or one graph replay): ids
        [R, K] on the device, not synced; None for a step that runs eagerly."""
        if steps > 1:
            return run_decode_steps(self, batch, states, steps)
        if self._fits_decode_graphs(batch, states):
            params = decode_sampling(states, batch.positions + 1, self.device)
            return self._run_decode_graph(batch, params)[:, None]
        return None

    def _read_decoded(
        self, batch: DeviceBatch, states: list[RequestState], ids: torch.Tensor
    ) -> tuple[list[int], list[TokenLogprobs | None] | None]:
        """The step's one sync; where a request asked, the logprob pass is launched before it,
        so that its launches overlap the steps' device time."""
        tops = asked_tops(states)
        packed = None
        if tops is not None:
            args = (self.model, self.pools, self.table.slots, batch, ids, widest(tops))
            packed = decode_pass(*args)
        next_ids = ids.flatten().tolist()  # item-major
        return next_ids, read_back(packed, tops, [ids.shape[1]] * len(states))

    def attach_graphs(self, runner: DecodeGraphRunner) -> None:
        """Decode steps that fit ``runner``'s buckets replay its graphs from now on."""
        self.graphs = runner
        runner.clock = self.clock

    def verify(self, items: list[VerifyItem]) -> VerifyStep:
        started = time.perf_counter()
        states = admit_trees(self.table, self.limits, items)
        trees = HostTrees(
            [it.token_ids for it in items],
            [it.parents for it in items],
            [s.row for s in states],
            [it.start_pos for it in items],
        )
        tops = asked_tops(states)
        masks = [it.allowed_tokens for it in items]
        masked = token_masks.any_masked(masks)
        if self._fits_verify_graphs(states, trees, masked):
            assert self.verify_graphs is not None
            want_hidden = [it.return_hidden for it in items]
            with torch.inference_mode():
                out = self.verify_graphs.run(trees, want_hidden, tops, masks if masked else None)
        else:
            asked = (tops, rows_needed(trees.parents, tops)) if tops is not None else None
            out = self._verify_eager(states, pad_trees(trees, self.device), items, asked)
        return self._verify_step(items, out, started)

    def _verify_eager(
        self,
        states: list[RequestState],
        trees: TreeBatch,
        items: list[VerifyItem],
        logprobs: tuple[Tops, int] | None,
    ) -> VerifyOutput:
        """Any tree: sampling, penalties, sizes past the verify graphs' buckets."""
        greedy = torch.tensor([s.sampling.temperature == 0 for s in states])
        params = sampling_tensors(states, trees.start_pos, self.device)
        with torch.inference_mode(), self.clock.region():
            out = run_verify(
                self.model,
                self.pools,
                self.table.slots,
                trees,
                params,
                greedy,
                any(it.return_hidden for it in items),
                paged=self.paged,
                logprobs=logprobs,
                penalize=lambda logits, layout: token_masks.restrict_tree(
                    penalties.penalize_tree(
                        logits, states, trees.tokens, trees.valid, layout.ancestors
                    ),
                    [it.allowed_tokens for it in items],
                    [len(it.token_ids) for it in items],
                ),
            )
            penalties.record(states, out.token_ids, self.model_config.vocab_size, self.device)
        return out

    def attach_verify_graphs(self, runner: VerifyGraphRunner) -> None:
        """Greedy verify steps that fit ``runner``'s buckets run its fixed-shape step."""
        self.verify_graphs = runner
        runner.clock = self.clock

    def _verify_step(
        self, items: list[VerifyItem], out: VerifyOutput, started: float
    ) -> VerifyStep:
        results = verify_results(items, out)
        wall_ms = (time.perf_counter() - started) * 1e3
        return VerifyStep(results, wall_ms, self.clock.take_ms())

    def _fits_verify_graphs(
        self, states: list[RequestState], trees: HostTrees, masked: bool
    ) -> bool:
        plain = all(s.sampling.temperature == 0 and not penalties.has_penalty(s) for s in states)
        runner = self.verify_graphs
        return plain and runner is not None and runner.can_run(*trees.shape, masked)

    def read_hidden(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """Hidden rows of context positions [start, end) of a request, on the host."""
        state = self.table.get(request_id)
        if not 0 <= start <= end <= state.table_len:
            raise InvalidStep(
                f"rows [{start}, {end}) outside the request's {state.table_len} slots"
            )
        slots = self.table.slots[state.row, start:end]
        with torch.inference_mode():
            return self.pools.hidden[slots].to("cpu")

    def release(self, request_ids: list[str]) -> int:
        return sum(self.table.release(rid) for rid in request_ids)

    def release_all(self) -> int:
        return self.release(self.table.ids())

    # ---- the step -----------------------------------------------------------------------

    def _run(
        self,
        batch: DeviceBatch,
        sampled: list[RequestState],
        scores: ScorePlan | None,
        masks: list[bytes],
    ) -> tuple[list[int], Answers, Answers]:
        """The eager step: next ids of the sampled items (penalised, and masked where
        structured output sent ``masks``), the logprobs of those whose request asked, from
        the step's own logits (before penalties), and the items' prompt scores."""
        hidden = self._forward_tokens(batch)
        packed_scores = score_pass(self.model, hidden, scores) if scores else None
        if not sampled:
            return [], None, read_scores(packed_scores, scores)
        raw = self.model.logits(hidden[batch.sample_index])
        positions = batch.positions[batch.sample_index] + 1
        next_ids, answers = sample_changed(raw, sampled, positions, masks)
        return next_ids, answers, read_scores(packed_scores, scores)

    def _changed_decode(
        self, batch: DeviceBatch, states: list[RequestState], masks: list[bytes]
    ) -> tuple[list[int], Answers]:
        """A decode step whose logits change before sampling: the graph's logits, then the
        changes and the draw (changed_logits.py)."""
        raw = self._run_decode_graph(batch, None, logits=True)
        with self.clock.region():
            return sample_changed(raw, states, batch.positions + 1, masks)

    def _forward_tokens(self, batch: DeviceBatch) -> torch.Tensor:
        """The model over the batch's tokens; writes their KV and hidden rows; hidden out."""
        write_slots = self.table.slots[batch.token_rows, batch.positions]
        meta = self._metadata(batch, write_slots)
        hidden = self.model(batch.input_ids, batch.positions, (self.pools.k, self.pools.v), meta)
        self.pools.hidden.index_copy_(0, write_slots, hidden)
        return hidden

    def decode_on_device(
        self, batch: DeviceBatch, states: list[RequestState], params: SamplingTensors | None
    ) -> torch.Tensor:
        """One decode step of requests without penalties (every item one token, sampled):
        the graph replay where it fits, else eager; next ids [R] on the device, no host sync.
        ``params``: ``decode_sampling`` (sampling_tensors.py) at ``batch.positions + 1``."""
        if self._fits_decode_graphs(batch, states):
            return self._run_decode_graph(batch, params)
        with self.clock.region():
            logits = self.model.logits(self._forward_tokens(batch)[batch.sample_index])
            if params is None:
                return fused.greedy_ids(logits)
            return sample_greedy_or_drawn(logits, params)  # = sample(): no host greedy check

    def _metadata(
        self, batch: DeviceBatch, write_slots: torch.Tensor
    ) -> AttentionMetadata | paged.PagedMetadata:
        slots = self.table.slots
        if self.paged:
            dummy = self.pools.dummy_slot
            return paged.for_sequences(
                slots, batch.token_rows, batch.positions, write_slots, dummy, batch.max_context
            )
        key_slots = slots[batch.rows, : batch.max_context]
        return build_metadata(write_slots, key_slots, batch.start_pos, batch.num_new, batch.max_new)

    def _fits_decode_graphs(self, batch: DeviceBatch, states: list[RequestState]) -> bool:
        """A decode step of a graph bucket's shape (a step whose logits change runs the
        LOGITS graphs, the others the sampling ones)."""
        return (
            self.graphs is not None
            and batch.max_new == 1
            and batch.sample_index.shape[0] == len(states)  # every item sampled
            and self.graphs.can_run(len(states), batch.max_context)
        )

    def _run_decode_graph(
        self, batch: DeviceBatch, params: SamplingTensors | None, logits: bool = False
    ) -> torch.Tensor:
        """Next ids [R] from the sampling graphs, or with ``logits`` the step's raw logits."""
        assert self.graphs is not None
        slots = self.table.slots
        step = DecodeInputs(
            input_ids=batch.input_ids,
            positions=batch.positions,
            write_slots=slots[batch.rows, batch.positions],
            table_rows=batch.rows,
            max_context=batch.max_context,
            sampling=params,
            key_slots=None if self.paged else slots[batch.rows, : batch.max_context],
        )
        return self.graphs.run_logits(step) if logits else self.graphs.run(step)
