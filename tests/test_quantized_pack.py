"""The few-row kernel's quantized copies (model_runtime/quantized_pack.py, kernels/
quantized_search.h, kernels/quantized_weights.h): found in fp32 values that are Q4_1 or Q8_0
blocks, they rebuild every weight bit for bit, and the kernel's products on them are the fp32
copy's, bit for bit."""

from __future__ import annotations

import argparse

import pytest
import torch

from kernels import few_row_linear
from model_runtime import quantized_pack
from model_runtime.packed_linear import Linear, prepack_linears
from target_service import arguments as target_arguments

REASON = few_row_linear.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"kernel cannot run here: {REASON}")
GROUP = quantized_pack.GROUP


@pytest.fixture(scope="module")
def kernel():
    module = few_row_linear.load()
    assert module is not None
    return module


def q4_1_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """What a loader dequantizes a Q4_1 tensor to: per block of 32, fp16 d and m, q in 0..15."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, 1, generator=gen) * 0.01).half().float()
    m = (-torch.rand(n, k // GROUP, 1, generator=gen) * 0.08).half().float()
    q = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # the quantizer gives the least value q 0 and the largest 15
    return (d * q + m).reshape(n, k)


def q8_0_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // GROUP, 1, generator=gen) * 0.01).half().float()
    q = torch.randint(-127, 128, (n, k // GROUP, GROUP), generator=gen).float()
    q[..., 0] = 127
    return (d * q).reshape(n, k)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_the_python_layout_is_the_kernels(kernel) -> None:
    """dequantize() and kind() read copies that kernels/quantized_search.h lays out."""
    expected = (GROUP, quantized_pack.Q4_1_BYTES, quantized_pack.Q8_0_BYTES)
    assert kernel.group_bytes() == expected == (32, 320, 544)


@pytest.mark.parametrize(
    ("make", "kind", "bits"), [(q4_1_weight, "q4_1", 5), (q8_0_weight, "q8_0", 8.5)]
)
def test_blocks_are_found_and_rebuild_every_weight(kernel, make, kind: str, bits: float) -> None:
    weight = make(96, 576)
    packed = quantized_pack.pack_quantized(kernel, weight)
    assert packed is not None and quantized_pack.kind(packed) == kind
    assert packed.numel() * 8 == weight.numel() * bits
    assert same_bits(quantized_pack.dequantize(packed), weight)


@pytest.mark.parametrize("make", [q4_1_weight, q8_0_weight])
def test_the_kernel_on_a_quantized_copy_gives_the_fp32_copys_bits(kernel, make) -> None:
    weight = make(1536, 576, seed=3)
    packed, fp32 = quantized_pack.pack_quantized(kernel, weight), kernel.pack(weight)
    gen = torch.Generator().manual_seed(4)
    for rows in range(1, few_row_linear.MAX_ROWS + 1):
        x = torch.randn(rows, 576, generator=gen)
        assert same_bits(kernel.linear(x, packed), kernel.linear(x, fp32)), rows


def test_moved_rows_keep_their_blocks(kernel) -> None:
    """The loader permutes q/k rows and fuses projections: whole rows move, blocks stay."""
    weight = torch.cat([q4_1_weight(64, 64, seed=5), q4_1_weight(32, 64, seed=6)])
    moved = weight[torch.randperm(96, generator=torch.Generator().manual_seed(7))]
    packed = quantized_pack.pack_quantized(kernel, moved)
    assert packed is not None and same_bits(quantized_pack.dequantize(packed), moved)


def test_weights_that_are_no_quantized_blocks_get_none(kernel) -> None:
    assert quantized_pack.pack_quantized(kernel, torch.randn(64, 64)) is None
    nudged = q4_1_weight(64, 64)
    nudged[40, 33] = torch.nextafter(nudged[40, 33], torch.tensor(1.0))  # one value, one ulp
    assert quantized_pack.pack_quantized(kernel, nudged) is None
    assert quantized_pack.pack_quantized(kernel, q4_1_weight(20, 64)) is None  # 16 columns a block
    assert quantized_pack.pack_quantized(kernel, torch.zeros(16, 48)) is None  # 32 values a block


def test_a_prepacked_layer_reads_its_quantized_copy_unless_told_not_to(kernel) -> None:
    torch.manual_seed(0)
    layers = [Linear(576, 192, bias=False) for _ in range(2)]
    for layer in layers:
        with torch.no_grad():
            layer.weight.copy_(q4_1_weight(192, 576, seed=8))
    assert prepack_linears(layers[0])[1] == "few-row kernel (q4_1 copies)"
    packed_bytes, packer = prepack_linears(layers[1], quantized=False)
    assert packer == "few-row kernel" and packed_bytes == 192 * 576 * 4
    assert layers[0].packed is not None and layers[0].packed.dtype == torch.uint8
    x = torch.randn(16, 576)
    for rows in (1, 4, 16):
        assert same_bits(layers[0](x[:rows]), layers[1](x[:rows]))


def test_a_mixed_model_names_its_copies() -> None:
    model = torch.nn.Sequential(Linear(64, 32, bias=False), Linear(64, 32, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(q8_0_weight(32, 64))
    assert prepack_linears(model)[1] == "few-row kernel (copies: q8_0 x1, float32 x1)"


def test_the_target_flag_turns_the_copies_off() -> None:
    parser = argparse.ArgumentParser()
    target_arguments.add_arguments(parser)
    on = target_arguments.config_from_args(parser.parse_args([]))
    off = target_arguments.config_from_args(parser.parse_args(["--no-quantized-copies"]))
    assert on.quantized_copies and not off.quantized_copies
