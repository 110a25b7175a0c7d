"""Which matmul the model's linear layers use on CUDA: cuBLAS's (fastest; its rounding follows
the step's shape) or the batch-invariant Triton kernel (kernels/invariant_matmul.py) of the
target's --exact mode. Chosen once per process, like model_runtime/fused.py's kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_enabled = False


def use_invariant_matmul(enabled: bool) -> None:
    global _enabled
    _enabled = enabled


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if not (_enabled and x.is_cuda):
        return F.linear(x, weight, bias)
    from kernels.invariant_matmul import matmul  # triton: imported only where it runs

    out = matmul(x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], weight.shape[0])
    return out if bias is None else out + bias
