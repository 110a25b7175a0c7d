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


def device_problem(device: str) -> str:
    """Why ``device`` cannot run on this machine, or '' when it can: a CUDA device asked of a
    torch without CUDA or of a machine without a GPU, an index past its GPUs, another name."""
    if device == "cpu":
        return ""
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        return f"--device {device}: unknown device; use cpu, cuda or cuda:N"
    if not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (f"--device {device}: torch {torch.__version__} ({build}) sees no CUDA device "
                "on this machine; use --device cpu")  # fmt: skip
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        return f"--device {device}: this machine has {count} CUDA device(s), from cuda:0"
    return ""
