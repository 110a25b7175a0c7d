"""The few-row kernel (kernels/few_row_linear.cpp: fp32 rows, fp32 or bf16 weights) against its
torch reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import few_row_linear
from model_runtime.packed_linear import (
    KERNEL_MIN_ROWS,
    MKL_MIN_ROWS,
    PACKED_MAX_ROWS,
    Linear,
    can_prepack,
    prepack_linears,
)

REASON = few_row_linear.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"kernel cannot run here: {REASON}")
needs_mkl_packing = pytest.mark.skipif(
    not can_prepack(torch.zeros(1)), reason="this torch build has no MKL packed sgemm"
)


@pytest.fixture(scope="module")
def kernel():
    if REASON is not None:
        pytest.skip(f"kernel cannot run here: {REASON}")
    module = few_row_linear.load()
    assert module is not None, "the kernel should build where unavailable_reason() is None"
    return module


def error_vs_float64(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    exact = few_row_linear.reference(x.double(), weight.double())
    return (got.double() - exact).abs().max().item()


@pytest.mark.parametrize("rows", range(1, few_row_linear.MAX_ROWS + 1))
def test_every_row_count_is_as_accurate_as_torch(kernel, rows: int) -> None:
    torch.manual_seed(rows)
    weight, x = torch.randn(1536, 576), torch.randn(rows, 576)
    got = kernel.linear(x, kernel.pack(weight))
    assert got.shape == (rows, 1536)
    torch.testing.assert_close(got, few_row_linear.reference(x, weight), rtol=1e-5, atol=1e-4)
    # Chunked sums keep its rounding error within torch's own (MKL) on the same product.
    ours = error_vs_float64(got, x, weight)
    assert ours <= 2 * error_vs_float64(F.linear(x, weight), x, weight) + 1e-6


def test_the_rows_a_pass_takes_are_the_builds(kernel) -> None:
    """The draft service sizes CPU trees by it (draft_service/arguments.py)."""
    assert kernel.rows_per_pass() == few_row_linear.rows_per_pass()


@pytest.mark.parametrize(("out_features", "in_features"), [(16, 1), (48, 40), (192, 1536)])
def test_odd_shapes(kernel, out_features: int, in_features: int) -> None:
    weight, x = torch.randn(out_features, in_features), torch.randn(5, in_features)
    got = kernel.linear(x, kernel.pack(weight))
    torch.testing.assert_close(got, few_row_linear.reference(x, weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 4, few_row_linear.MAX_ROWS])
def test_bf16_weights_are_widened_and_multiplied_in_fp32(kernel, rows: int) -> None:
    """A drafter's packed copy in bf16 (half the bytes a step reads): the product is fp32's
    over the bf16 values, and a row's bits do not depend on the rows beside it."""
    torch.manual_seed(rows)
    weight, x = torch.randn(1536, 576).bfloat16(), torch.randn(rows, 576)
    packed = kernel.pack(weight)
    assert packed.dtype == torch.bfloat16 and packed.shape == (96, 576, 16)
    got = kernel.linear(x, packed)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, few_row_linear.reference(x, weight), rtol=1e-5, atol=1e-4)
    # Exactly the fp32 kernel's result on the same values: only the load differs.
    assert torch.equal(got, kernel.linear(x, kernel.pack(weight.float())))
    assert torch.equal(got[-1:], kernel.linear(x[-1:], packed))


def test_pack_layout_is_blocks_of_16_columns(kernel) -> None:
    weight = torch.arange(32 * 3, dtype=torch.float32).view(32, 3)
    packed = kernel.pack(weight)
    assert packed.shape == (2, 3, 16)
    assert torch.equal(packed[1, 2], weight[16:32, 2])


def test_bad_input_is_refused(kernel) -> None:
    packed = kernel.pack(torch.randn(32, 8))
    with pytest.raises(RuntimeError, match="1 to 16 rows"):
        kernel.linear(torch.randn(17, 8), packed)
    with pytest.raises(RuntimeError, match="in_features"):
        kernel.linear(torch.randn(2, 9), packed)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernel.pack(torch.randn(20, 8))
    with pytest.raises(RuntimeError, match="float32"):
        kernel.linear(torch.randn(2, 8, dtype=torch.float64), packed)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernel.pack(torch.randn(32, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="from pack"):
        kernel.linear(torch.randn(2, 8), packed.half())


@needs_kernel
@needs_mkl_packing
def test_linear_layers_take_the_kernel_from_one_row_to_a_verify_sized_step() -> None:
    """Decode steps (1 row) as well as verify steps: on a 2-core AMD EPYC torch's one-row GEMV
    ran 1.3-2.7x slower than the kernel."""
    torch.manual_seed(0)
    layer = Linear(64, 32, bias=True)
    packed_bytes, packer = prepack_linears(layer)
    assert (packed_bytes, packer) == (64 * 32 * 4, "few-row kernel")
    assert KERNEL_MIN_ROWS == layer.min_rows == 1
    x = torch.randn(layer.max_rows + 1, 64)
    expected = F.linear(x, layer.weight, layer.bias)
    with torch.no_grad():  # only the packed copy is left to answer few-row steps
        layer.weight.zero_()
    for rows in (1, 2, 3, PACKED_MAX_ROWS, layer.max_rows):
        torch.testing.assert_close(layer(x[:rows]), expected[:rows], rtol=1e-5, atol=1e-5)
    # Past the rows measured faster on the kernel, torch's own kernel reads the (zeroed) weight.
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


@needs_kernel
@needs_mkl_packing
def test_a_bf16_packed_layer_rounds_its_own_weight_so_every_row_count_agrees() -> None:
    """Drafters pack in bf16: the layer's fp32 weight takes the same values, so the steps
    past the kernel's rows (torch's kernel) compute with the weights the kernel reads."""
    torch.manual_seed(0)
    layer = Linear(64, 32, bias=True)
    original = layer.weight.detach().clone()
    packed_bytes, packer = prepack_linears(layer, packed_dtype=torch.bfloat16)
    assert (packed_bytes, packer) == (64 * 32 * 2, "few-row kernel (bfloat16 copies)")
    assert layer.packed is not None and layer.packed.dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32
    assert torch.equal(layer.weight, original.bfloat16().float())
    x = torch.randn(layer.max_rows + 1, 64)
    for rows in (1, 4, PACKED_MAX_ROWS):  # the kernel's result is torch's on the rounded weight
        want = F.linear(x[:rows], layer.weight, layer.bias)
        torch.testing.assert_close(layer(x[:rows]), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32"):
        prepack_linears(Linear(64, 32), exact=True, packed_dtype=torch.bfloat16)


@needs_kernel
@needs_mkl_packing
def test_shapes_the_kernel_cannot_take_fall_back_to_mkl_and_the_name_says_so() -> None:
    model = torch.nn.Sequential(Linear(64, 32, bias=False), Linear(64, 20, bias=False))
    assert prepack_linears(model)[1] == "few-row kernel for 1 layers, MKL for 1"
    x = torch.randn(8, 64)
    for layer in model:
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


@needs_mkl_packing
def test_mkl_packing_stays_available_from_four_rows() -> None:
    layer = Linear(64, 32, bias=False)
    assert prepack_linears(layer, use_kernel=False)[1] == "MKL"
    assert layer.min_rows == MKL_MIN_ROWS == 4  # fewer rows were slower on MKL's packed sgemm
    x = torch.randn(8, 64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert torch.equal(layer(x[:3]), F.linear(x[:3], layer.weight))


def test_the_published_module_imports_without_a_compiler(kernel) -> None:
    """Processes that did not build the kernel import the .so that the builder published."""
    from plumbing.paths import default_cache_dir

    module = few_row_linear._import_built(few_row_linear.build_folder(default_cache_dir()))
    weight, x = torch.randn(32, 24), torch.randn(5, 24)
    torch.testing.assert_close(
        module.linear(x, module.pack(weight)), few_row_linear.reference(x, weight)
    )


@pytest.mark.parametrize(
    ("capability", "flags", "expected"),
    [
        ("AVX512", set(), "avx512"),
        ("AVX2", {"avx2", "fma", "f16c"}, "avx2"),
        ("AVX2", {"avx2", "fma"}, None),  # no F16C: the quantized copies' scales need it
        ("DEFAULT", {"f16c"}, None),
    ],
)
def test_the_build_follows_the_cpus_instruction_set(monkeypatch, capability, flags, expected):
    """AVX-512 where torch reports it, else AVX2 with F16C; neither leaves torch's kernels,
    and says why. The build folder and module name differ per instruction set."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(few_row_linear, "cpu_flags", lambda: flags)
    few_row_linear.instruction_set.cache_clear()
    try:
        assert few_row_linear.instruction_set() == expected
        reason = few_row_linear.unavailable_reason()
        if expected is None:
            assert reason is not None and "AVX2 with F16C" in reason and capability in reason
        elif reason is not None:  # the CPU's set is fine; a missing compiler may still say no
            assert "not installed" in reason
    finally:
        few_row_linear.instruction_set.cache_clear()
    wide, narrow = (few_row_linear.build_folder(Path("/c"), isa) for isa in ("avx512", "avx2"))
    assert wide != narrow and narrow.name.startswith("splitspec_few_row_linear_avx2-")
