"""Shared checks of the Triton kernel tests (tests/test_fused_kernels.py, test_layer_ops.py).

Import this module before anything imports triton: on a machine without CUDA it turns on
Triton's interpreter (TRITON_INTERPRET=1), so the same kernel code runs on CPU tensors.
"""

from __future__ import annotations

import os

import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if ON_CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
# One rounding in a kernel, one per op in its reference: a few bf16 ulps apart at most.
TOLERANCE = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}


def poisoned(like: torch.Tensor) -> torch.Tensor:
    return torch.full_like(like, float("nan"))


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    assert not got.isnan().any(), "the kernel left poisoned elements"
    rtol, atol = TOLERANCE[want.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)
