"""Shared checks of the Triton kernel tests (tests/test_fused_kernels.py, test_layer_ops.py).

Import this module before anything imports triton: on a machine without CUDA it turns on
Triton's interpreter (TRITON_INTERPRET=1), so the same kernel code runs on CPU tensors.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
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


@functools.cache
def host_matmul_is_row_invariant() -> bool:
    """Whether numpy's matmul gives a row the same bits alone as in a 64-row block. Under Triton's
    interpreter a kernel's tl.dot is that matmul, so a kernel's row invariance can only show on
    a CPU where it holds: OpenBLAS's AVX2 kernels (seen on an AMD EPYC, 2026-12-02) round rows
    6-15 and 22-31 of a 64-row block differently from the same row alone."""
    if ON_CUDA:
        return True
    gen = np.random.default_rng(0)
    block = gen.standard_normal((64, 576)).astype(np.float32)
    weight = gen.standard_normal((576, 64)).astype(np.float32)
    together = block @ weight
    alone = np.zeros_like(block)
    for i in range(block.shape[0]):
        alone[0] = block[i]
        if not np.array_equal((alone @ weight)[0], together[i]):
            return False
    return True


needs_row_invariant_host_matmul = pytest.mark.skipif(
    not host_matmul_is_row_invariant(),
    reason="under Triton's interpreter tl.dot is numpy's matmul, and this CPU's BLAS gives a row "
    "different bits by its place in a block, so a kernel's bit invariance cannot show here "
    "(the GPU runs check it)",
)
