"""The CPU row ops (kernels/row_ops.h: RMSNorm and rotary in one call each) against torch's
reference (kernels/fused_reference.py), and when the model takes them (model_runtime/fused.py):
rotary gives the reference's bits; RMSNorm is within an ulp or two of it and gives a row the
same bits alone or among others (what --exact needs); training, with autograd on, keeps torch."""

from __future__ import annotations

import pytest
import torch

from kernels import few_row_linear, fused_reference
from model_runtime import fused

REASON = few_row_linear.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"kernel cannot run here: {REASON}")
HEAD_DIM = 64
EPS = 1e-5


@pytest.fixture(scope="module")
def kernel():
    module = few_row_linear.load()
    assert module is not None, "the kernel should build where unavailable_reason() is None"
    return module


@pytest.fixture
def row_ops_on(kernel):
    """The process-wide switch, as a CPU engine's kernel load sets it; put back afterwards."""
    before = fused._cpu_rows
    fused.use_cpu_row_ops(kernel)
    yield kernel
    fused.use_cpu_row_ops(before)


def table_rows(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin as the model passes them: [T, 1, D] views of one [T, 2, D] gather."""
    rows = torch.randn(tokens, 2, HEAD_DIM)
    return rows[:, :1], rows[:, 1:]


@pytest.mark.parametrize("tokens, heads", [(1, 9), (9, 3), (64, 9), (300, 3)])
def test_rotary_gives_the_references_bits(kernel, tokens: int, heads: int) -> None:
    torch.manual_seed(tokens)
    x = torch.randn(tokens, heads, HEAD_DIM) * 4
    cos, sin = table_rows(tokens)
    assert torch.equal(kernel.rotary(x, cos, sin), fused_reference.rotary(x, cos, sin))


@pytest.mark.parametrize("rows, width", [(1, 576), (9, 576), (200, 576), (5, 100)])
def test_rms_norm_is_the_reference_within_rounding(kernel, rows: int, width: int) -> None:
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, width) * 3, torch.randn(width)
    got, want = kernel.rms_norm(x, weight, EPS), fused_reference.rms_norm(x, weight, EPS)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    exact = fused_reference.rms_norm(x.double(), weight.double(), EPS)
    assert (got.double() - exact).abs().max() <= 4 * (want.double() - exact).abs().max() + 1e-7


def test_a_rows_norm_has_the_same_bits_alone_or_among_others(kernel) -> None:
    torch.manual_seed(3)
    x, weight = torch.randn(40, 576) * 3, torch.randn(576)
    together = kernel.rms_norm(x, weight, EPS)
    for i in range(len(x)):
        assert torch.equal(kernel.rms_norm(x[i : i + 1], weight, EPS)[0], together[i])


def test_bad_input_is_refused_with_a_message(kernel) -> None:
    with pytest.raises(RuntimeError, match="float32"):
        kernel.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), EPS)
    with pytest.raises(RuntimeError, match=r"\[x.size\(-1\)\]"):
        kernel.rms_norm(torch.randn(2, 8), torch.randn(9), EPS)
    with pytest.raises(RuntimeError, match=r"\[T, 1, D\]"):
        kernel.rotary(torch.randn(2, 3, HEAD_DIM), *table_rows(3))


def test_the_model_takes_them_in_inference_and_torch_under_autograd(row_ops_on) -> None:
    torch.manual_seed(4)
    x, weight = torch.randn(9, 576), torch.nn.Parameter(torch.randn(576))
    q = torch.randn(9, 9, HEAD_DIM)
    cos, sin = table_rows(9)
    with torch.inference_mode():
        assert torch.equal(fused.rms_norm(x, weight, EPS), row_ops_on.rms_norm(x, weight, EPS))
        assert torch.equal(fused.rotary(q, cos, sin), row_ops_on.rotary(q, cos, sin))
        bf16 = x.bfloat16()  # another dtype: torch's reference
        assert torch.equal(fused.rms_norm(bf16, weight.data, EPS),
                           fused_reference.rms_norm(bf16, weight.data, EPS))  # fmt: skip
    trained = fused.rms_norm(x, weight, EPS)
    trained.sum().backward()
    assert weight.grad is not None and torch.equal(
        trained.detach(), fused_reference.rms_norm(x, weight.detach(), EPS)
    )
