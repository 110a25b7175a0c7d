"""A step's index tensors, built on the host from its items and moved to the device in one copy."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import torch

from target_service.admission import StepItem
from target_service.request_table import RequestState


@dataclass
class DeviceBatch:
    """Host-built index tensors of a step, on the device."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    rows: torch.Tensor  # [B] slot-table row of each request
    token_rows: torch.Tensor  # [T] slot-table row of each token
    start_pos: torch.Tensor  # [B]
    num_new: torch.Tensor  # [B]
    sample_index: torch.Tensor  # [R] token index whose logits are sampled
    _: KW_ONLY  # the tensors come from one *list, so the ints are named (mypy checks that)
    max_new: int
    max_context: int


def build_device_batch(
    items: list[StepItem], states: list[RequestState], device: torch.device
) -> DeviceBatch:
    input_ids: list[int] = []
    positions: list[int] = []
    token_rows: list[int] = []
    sample_index: list[int] = []
    for item, state in zip(items, states, strict=True):
        n = len(item.token_ids)
        input_ids += item.token_ids
        positions += range(item.start_pos, item.start_pos + n)
        token_rows += [state.row] * n
        if item.sample:
            sample_index.append(len(input_ids) - 1)
    starts = [it.start_pos for it in items]
    num_new = [len(it.token_ids) for it in items]
    rows = [s.row for s in states]
    return DeviceBatch(
        *on_device(device, input_ids, positions, rows, token_rows, starts, num_new, sample_index),
        max_new=max(num_new),
        max_context=max(s + n for s, n in zip(starts, num_new, strict=True)),
    )


def on_device(device: torch.device, *lists: list[int]) -> list[torch.Tensor]:
    """int64 tensors of ``lists`` on ``device``, from one host->device copy for them all."""
    sizes = [len(x) for x in lists]
    flat = torch.tensor([v for x in lists for v in x], dtype=torch.int64)
    return list(flat.to(device, non_blocking=True).split(sizes))
