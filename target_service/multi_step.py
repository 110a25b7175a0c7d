"""Multi-step decoding: K decode steps in one Forward, one device->host copy at the end.

Through the whole stack a decode token costs the step plus the router's and the RPC's own
work per step (about 1.5 ms on the H200 against a 1 ms graph replay). A Forward with
``decode_steps`` K runs K decode steps back to back instead: step k is exactly the decode step
a Forward of its own would run (the captured graph's replay where it fits, else the eager
step), at position start_pos + k, with the token step k - 1 sampled fed in on the device.
Sampling is keyed by (seed, position) (model_runtime/sampling.py), so the draws are those of K
separate steps: greedy and seeded output equal K = 1's token for token. The router keeps what
precedes the first stop and frees the rest (router/multi_step.py).

Penalties are refused (target_service/admission.py): their counts are recorded from host
lists after each step, which would put a host sync between steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from target_service.request_table import RequestState
from target_service.sampling_tensors import decode_sampling

if TYPE_CHECKING:
    from target_service.device_batch import DeviceBatch
    from target_service.engine import TargetEngine


def run_decode_steps(
    engine: TargetEngine, batch: DeviceBatch, states: list[RequestState], steps: int
) -> torch.Tensor:
    """``steps`` decode steps from ``batch`` (one token per request); ids [R, K] on the
    device, not yet synced (the engine reads them back, with logprobs where asked)."""
    # Built once: the per-request parameters do not change between steps, only the position.
    params = decode_sampling(states, batch.positions + 1, engine.device)
    input_ids = batch.input_ids
    sampled: list[torch.Tensor] = []
    for k in range(steps):
        step = replace(
            batch,
            input_ids=input_ids,
            positions=batch.positions + k,
            start_pos=batch.start_pos + k,
            max_context=batch.max_context + k,
        )
        step_params = None if params is None else replace(params, position=step.positions + 1)
        input_ids = engine.decode_on_device(step, states, step_params)
        sampled.append(input_ids)
    return torch.stack(sampled, dim=1)
