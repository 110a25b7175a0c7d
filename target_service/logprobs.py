"""Log-probabilities of committed tokens, computed in the step that commits them.

What is reported is the model's raw distribution, the log-softmax of the logits before
temperature, top-k/top-p and penalties (vLLM's default too). Under speculation it is the
target's at each committed position, never the drafter's; with ``--exact`` a token's hidden
row and logits have the same bits in any step, so speculative and target-only decoding report
the same values bit for bit.

Each route launches its pass after its device work and before its one device->host sync, so
that on a GPU the pass's launches overlap the step's device time, and reads it after:

* the eager step and the eager verify reuse the logits they computed (on a CPU the head's
  matmul is a fifth of a decode step: computing it twice would show);
* a decode graph's replay and a multi-step burst computed no fp32 logits: the pass reads the
  hidden rows they left in the pool (``decode_pass``);
* the verify runner reads its compacted hidden buffer (verify_graphs.py).

No captured graph changes, and requests that did not ask pay nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model_runtime.llama import LlamaForCausalLM
from model_runtime.pools import SlotPools
from target_service.device_batch import DeviceBatch
from target_service.logprob_pass import Tops, logits_pass
from target_service.request_table import RequestState
from target_service.tree_batch import tree_depth


def asked_tops(states: Sequence[RequestState]) -> Tops | None:
    """Each request's ask; None when none asked (then no pass at all)."""
    tops = [s.sampling.top_logprobs if s.sampling.logprobs else None for s in states]
    return tops if any(t is not None for t in tops) else None


def device_pass(
    model: LlamaForCausalLM, hidden_rows: torch.Tensor, tokens: torch.Tensor, top: int
) -> torch.Tensor:
    """``logits_pass`` over the logits of final hidden rows."""
    return logits_pass(model.logits(hidden_rows), tokens, top)


def decode_pass(
    model: LlamaForCausalLM,
    pools: SlotPools,
    slot_table: torch.Tensor,
    batch: DeviceBatch,
    ids: torch.Tensor,
    top: int,
) -> torch.Tensor:
    """``device_pass`` over decode steps' rows in the pool: item i's token k ([R, K] ``ids``)
    was chosen at position ``batch.positions[i] + k``. Every item's rows (no host index to
    copy): the caller keeps those of the requests that asked."""
    offsets = torch.arange(ids.shape[1], device=ids.device)
    slots = slot_table[batch.rows[:, None], batch.positions[:, None] + offsets]
    return device_pass(model, pools.hidden[slots.flatten()], ids.flatten(), top)


def rows_needed(parents: list[list[int]], tops: Tops) -> int:
    """Path nodes a verify may commit from, over the trees that asked: the deepest's depth + 1."""
    return 1 + max(tree_depth(p) for p, top in zip(parents, tops, strict=True) if top is not None)
