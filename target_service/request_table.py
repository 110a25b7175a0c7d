"""Per-request state on the target: a slot-table row and the sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model_runtime.staging import Staging
from target_service.errors import InvalidStep, OutOfCapacity, UnknownRequest

# Appends up to this many slots go through a pinned buffer: a pageable host->device copy waits
# for the stream and cost ~0.1 ms of a verify step on the H200 box (py-spy, 2026-12-02).
STAGED_APPEND = 1024


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float
    top_p: float
    top_k: int
    seed: int
    presence_penalty: float = 0.0  # OpenAI's, over the completion (target_service.penalties)
    frequency_penalty: float = 0.0
    logprobs: bool = False  # report committed tokens' log-probabilities (logprobs.py)
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias): added before sampling
    min_p: float = 0.0  # vLLM's, in [0, 1]; 0: off (model_runtime/sampling.filtered_probs)
    # HF/vLLM's, over the prompt and the completion (target_service.penalties); 1: off
    repetition_penalty: float = 1.0
    repetition_context: tuple[int, ...] = ()  # the router's context ids at opening
    # Ids refused while fewer than min_tokens tokens were sampled since opening (the router
    # sends what the completion still owes: min_tokens minus its tokens so far)
    min_tokens: int = 0
    min_tokens_banned_ids: tuple[int, ...] = ()


@dataclass
class RequestState:
    row: int
    table_len: int  # positions 0..table_len-1 of the row hold router-assigned slots
    sampling: SamplingSpec
    counts: torch.Tensor | None = None  # [V] completion token counts, for penalties only
    bias: torch.Tensor | None = None  # [V] logit_bias, dense, built on first use (penalties.py)
    seen: torch.Tensor | None = None  # [V] bool: in the context, for repetition_penalty only
    num_sampled: int = 0  # tokens sampled since opening, counted while min_tokens may bind


class RequestTable:
    """Maps context positions to KV slots per request, on the device.

    ``slots[row, pos]`` is the slot of position ``pos`` of the request owning ``row``. The router
    assigns every slot; this table only records its choice so each step can send just the new
    slots instead of the whole context.
    """

    def __init__(self, max_requests: int, width: int, num_slots: int, device: torch.device) -> None:
        self.width = width
        self.num_slots = num_slots
        self.slots = torch.full((max_requests, width), num_slots, dtype=torch.int64, device=device)
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self._staging = Staging({"rows_cols_values": (STAGED_APPEND, 3)}, torch.int64, device)
        self._states: dict[str, RequestState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, request_id: str) -> RequestState:
        state = self._states.get(request_id)
        if state is None:
            raise UnknownRequest(f"no state for request {request_id!r} on the target")
        return state

    def find(self, request_id: str) -> RequestState | None:
        return self._states.get(request_id)

    def open(self, request_id: str, sampling: SamplingSpec) -> RequestState:
        """A new request's state; one still held under its id is dropped (admission.py)."""
        self.release(request_id)
        if not self._free_rows:
            raise OutOfCapacity(f"all {self.slots.shape[0]} request rows are in use")
        state = RequestState(self._free_rows.pop(), 0, sampling)
        self._states[request_id] = state
        return state

    def ids(self) -> list[str]:
        return list(self._states)

    def release(self, request_id: str) -> bool:
        state = self._states.pop(request_id, None)
        if state is None:
            return False
        self._free_rows.append(state.row)
        return True

    def check_append(self, state: RequestState, new_slots: list[int]) -> None:
        if state.table_len + len(new_slots) > self.width:
            raise InvalidStep(
                f"slot table overflow: {state.table_len + len(new_slots)} > {self.width}"
            )
        bad = [s for s in new_slots if not 0 <= s < self.num_slots]
        if bad:
            raise InvalidStep(f"slots out of range [0, {self.num_slots}): {bad[:5]}")

    def append(self, appends: list[tuple[RequestState, list[int]]]) -> None:
        """Writes every request's new slots with one device copy."""
        rows: list[int] = []
        cols: list[int] = []
        values: list[int] = []
        for state, new_slots in appends:
            rows += [state.row] * len(new_slots)
            cols += range(state.table_len, state.table_len + len(new_slots))
            values += new_slots
            state.table_len += len(new_slots)
        if len(values) > STAGED_APPEND:  # a prefill's many: one pageable copy
            rows_cols_values = torch.tensor([rows, cols, values]).to(self.slots.device)
            self.slots.index_put_((rows_cols_values[0], rows_cols_values[1]), rows_cols_values[2])
        elif values:
            self._append_staged(rows, cols, values)

    def _append_staged(self, rows: list[int], cols: list[int], values: list[int]) -> None:
        """A round's few slots through the pinned buffer: the copy does not wait for the
        stream, and the scatter after it runs in stream order."""
        count = len(values)
        host = self._staging.fill()["rows_cols_values"].numpy()
        host[:count] = list(zip(rows, cols, values, strict=True))
        self._staging.upload(3 * count)
        staged = self._staging.views["rows_cols_values"][:count]
        self.slots.index_put_((staged[:, 0], staged[:, 1]), staged[:, 2])
