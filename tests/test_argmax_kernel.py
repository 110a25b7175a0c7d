"""The greedy-id kernel (kernels/argmax.py) against torch.argmax, on CUDA or under Triton's
interpreter on CPU (tests/helpers/kernel_checks.py turns it on)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.kernel_checks import DEVICE, DTYPES

argmax = pytest.importorskip("kernels.argmax", reason="triton is not installed")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 49152), (3, 128256), (16, 1000), (2, 4096), (1, 7)])
def test_matches_torch(dtype, rows: int, cols: int) -> None:
    x = torch.randn(rows, cols, device=DEVICE).to(dtype)
    out = torch.full((rows,), -1, dtype=torch.long, device=DEVICE)  # poisoned
    got = argmax.argmax_rows(x, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(got, x.float().argmax(-1))


def test_ties_take_the_first_index_across_blocks() -> None:
    """The maximum repeated inside one block and in a later block: the first one wins."""
    x = torch.zeros(2, 3 * argmax.BLOCK + 5, device=DEVICE)
    x[0, [10, 11, argmax.BLOCK + 3]] = 5.0
    x[1, [2 * argmax.BLOCK + 1, 3 * argmax.BLOCK + 4]] = 7.0
    assert argmax.argmax_rows(x).tolist() == [10, 2 * argmax.BLOCK + 1]


def test_rows_of_minus_infinity_and_one_finite_value() -> None:
    x = torch.full((2, 5000), float("-inf"), device=DEVICE)
    x[1, 4999] = -3.0
    assert argmax.argmax_rows(x).tolist() == [0, 4999]


def test_a_strided_row_is_refused() -> None:
    x = torch.randn(8, 4, device=DEVICE).t()
    with pytest.raises(ValueError, match="contiguous"):
        argmax.argmax_rows(x)
