"""kernels/invariant_matmul.py: x @ weight.T against torch in fp64, and a row having the same
bits alone and among 2-130 rows, with the reduction whole and split. On CPU under Triton's
interpreter (CI), on CUDA compiled (where the invariance is the point: cuBLAS's rounding
follows the row count)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.kernel_checks import (  # first: sets TRITON_INTERPRET on CPU
    DEVICE,
    needs_row_invariant_host_matmul,
)

kernel = pytest.importorskip("kernels.invariant_matmul", reason="triton is not installed")
# (K, N): a model-like width, ragged tiles in both, and a reduction cut into 4 ranges.
SHAPES = [(576, 192), (72, 100), (1536, 40)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inner,cols", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 70])
def test_matches_torch(dtype, inner: int, cols: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows + cols)
    x = torch.randn(rows, inner, generator=gen).to(DEVICE, dtype)
    w = torch.randn(cols, inner, generator=gen).to(DEVICE, dtype)
    got = kernel.matmul(x, w)
    want = x.double() @ w.double().T
    assert got.dtype == dtype and got.shape == (rows, cols) and not got.isnan().any()
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance * inner**0.5)


def test_long_reductions_are_split_by_the_weights_shape_alone() -> None:
    assert kernel.config_for(40, 1536) == (32, 4)
    assert kernel.config_for(4096, 14336) == (64, 8)  # Llama-3.1-8B's down projection
    assert kernel.config_for(192, 576)[1] == 1


@needs_row_invariant_host_matmul
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inner,cols", [(576, 192), (1536, 40)])
def test_a_row_has_the_same_bits_alone_and_among_others(dtype, inner: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(130, inner, generator=gen).to(DEVICE, dtype)
    w = torch.randn(cols, inner, generator=gen).to(DEVICE, dtype)
    alone = [kernel.matmul(x[i : i + 1], w) for i in (0, 63, 64, 129)]
    for rows in (2, 16, 65, 130):
        out = kernel.matmul(x[:rows], w)
        for i, row in zip((0, 63, 64, 129), alone, strict=True):
            if i < rows:
                assert torch.equal(out[i : i + 1], row), f"row {i} among {rows}"
