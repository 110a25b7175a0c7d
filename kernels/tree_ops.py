"""Tree ops by device: the Triton kernels on CUDA where Triton imports, the torch reference else.

Same signatures as kernels/tree_reference.py (and kernels/tree_kernels.py):

    tree_mask_and_positions(parents, valid, start_pos) -> TreeMask(ancestors, depths, positions)
    greedy_accept_path(tokens, parents, valid, target_next) -> Acceptance(path, num_accepted,
                                                                          next_token)
    compact_accepted(pools, node_slots, path, dummy_slot) -> None (in place)

``SPLITSPEC_TREE_KERNELS=torch`` forces the reference everywhere (for A/B runs). Triton under its
interpreter (``TRITON_INTERPRET=1``) is never picked here: it runs on host copies, which is for
tests, not for serving.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from types import ModuleType

import torch
from torch import Tensor

from kernels import tree_reference
from kernels.tree_reference import Acceptance, TreeMask

log = logging.getLogger("splitspec.kernels")


@functools.cache
def _triton_kernels() -> ModuleType | None:
    if os.environ.get("SPLITSPEC_TREE_KERNELS", "").lower() == "torch":
        return None
    try:
        from kernels import tree_kernels
    except ImportError as exc:  # no triton in this environment
        log.warning("tree ops: Triton unavailable (%s); using the torch reference on CUDA", exc)
        return None
    return None if tree_kernels.INTERPRETED else tree_kernels


def backend(device: torch.device) -> ModuleType:
    """The module whose functions run tree ops on ``device``."""
    if device.type == "cuda":
        kernels = _triton_kernels()
        if kernels is not None:
            return kernels
    return tree_reference


def tree_mask_and_positions(parents: Tensor, valid: Tensor, start_pos: Tensor) -> TreeMask:
    return backend(parents.device).tree_mask_and_positions(parents, valid, start_pos)


def greedy_accept_path(
    tokens: Tensor, parents: Tensor, valid: Tensor, target_next: Tensor
) -> Acceptance:
    return backend(tokens.device).greedy_accept_path(tokens, parents, valid, target_next)


def compact_accepted(
    pools: Sequence[Tensor], node_slots: Tensor, path: Tensor, dummy_slot: int
) -> None:
    backend(path.device).compact_accepted(pools, node_slots, path, dummy_slot)
