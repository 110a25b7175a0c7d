"""The fused Triton kernels (kernels/fused_ops.py) against their torch references.

On CUDA they run as compiled kernels; on CPU under Triton's interpreter (TRITON_INTERPRET=1,
set by tests/helpers/kernel_checks.py before triton is imported), so CI checks the same kernel code
without a GPU.
Outputs are poisoned with NaN first, so a kernel that skips an element cannot pass.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.kernel_checks import DEVICE, DTYPES, assert_matches, poisoned

fused_ops = pytest.importorskip("kernels.fused_ops", reason="triton is not installed")

from kernels import fused_reference  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 576), (7, 576), (3, 4096), (5, 100)])
def test_rms_norm(dtype, rows: int, cols: int) -> None:
    x = torch.randn(rows, cols, device=DEVICE).to(dtype) * 3
    weight = (torch.rand(cols, device=DEVICE) + 0.5).to(dtype)
    out = poisoned(x)
    got = fused_ops.rms_norm(x, weight, 1e-5, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert_matches(got, fused_reference.rms_norm(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,heads,head_dim", [(1, 9, 64), (16, 3, 64), (4, 8, 128)])
def test_rotary(dtype, tokens: int, heads: int, head_dim: int) -> None:
    x = torch.randn(tokens, heads, head_dim, device=DEVICE).to(dtype)
    angles = torch.rand(tokens, 1, head_dim // 2, device=DEVICE) * 6.3
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    got = fused_ops.rotary(x, cos, sin, out=poisoned(x))
    assert_matches(got, fused_reference.rotary(x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1536), (16, 1536), (3, 1000)])
def test_silu_mul(dtype, shape: tuple[int, int]) -> None:
    gate = (torch.randn(shape, device=DEVICE) * 4).to(dtype)
    up = torch.randn(shape, device=DEVICE).to(dtype)
    got = fused_ops.silu_mul(gate, up, out=poisoned(gate))
    assert_matches(got, fused_reference.silu_mul(gate, up))


def test_rows_do_not_depend_on_their_neighbours() -> None:
    """One row alone and the same row inside batches of 2-16 rows give the same bits."""
    x = torch.randn(16, 576, device=DEVICE).to(torch.bfloat16)
    weight = torch.rand(576, device=DEVICE).to(torch.bfloat16)
    alone = fused_ops.rms_norm(x[:1].clone(), weight, 1e-5)
    for rows in (2, 5, 16):
        assert torch.equal(fused_ops.rms_norm(x[:rows].clone(), weight, 1e-5)[:1], alone)
