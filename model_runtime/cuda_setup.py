"""Process-wide CUDA settings both model services make before their first step."""

from __future__ import annotations

import torch


def prefer_efficient_attention() -> None:
    """Keeps torch's SDPA off cuDNN.

    cuDNN's attention builds a new plan for every new key length: in bf16 it was picked for
    every eager step and cost ~70 ms a step (the target's decode, the drafter's tree search).
    The memory-efficient kernel has no such cost.
    """
    torch.backends.cuda.enable_cudnn_sdp(False)
