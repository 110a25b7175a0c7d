"""A step's per-request sampling parameters as device tensors (model_runtime/sampling.py)."""

from __future__ import annotations

import torch

from model_runtime.sampling import SamplingTensors
from target_service.request_table import RequestState


def decode_sampling(
    states: list[RequestState], positions: torch.Tensor, device: torch.device
) -> SamplingTensors | None:
    """A decode step's sampling tensors; None when every request is greedy (the graphs and
    the eager step then take the argmax, with no draw)."""
    if all(s.sampling.temperature == 0 for s in states):
        return None
    return sampling_tensors(states, positions, device)


def sampling_tensors(
    states: list[RequestState], positions: torch.Tensor, device: torch.device
) -> SamplingTensors:
    """``positions``: where each request's draw is keyed (its seed and the sampled position)."""
    specs = [s.sampling for s in states]
    floats = torch.tensor([[s.temperature, s.top_p, s.min_p] for s in specs], dtype=torch.float32)
    ints = torch.tensor([[s.top_k, s.seed & 0x7FFFFFFFFFFFFFFF] for s in specs], dtype=torch.int64)
    floats, ints = floats.to(device), ints.to(device)
    ranked = any(s.top_k > 0 or s.top_p < 1.0 for s in specs)
    return SamplingTensors(
        floats[:, 0], floats[:, 1], ints[:, 0], ints[:, 1], positions, floats[:, 2], ranked
    )
