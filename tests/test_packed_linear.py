"""Prepacked linears: few-row steps take the packed weight (the few-row kernel's or MKL's) and
agree with torch's kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model_runtime.packed_linear import (
    PACKED_MAX_ROWS,
    Linear,
    can_prepack,
    prepack_linears,
)

pytestmark = pytest.mark.skipif(
    not can_prepack(torch.zeros(1)), reason="this torch build has no MKL packed sgemm"
)


def packed_layer(in_features: int, out_features: int) -> Linear:
    torch.manual_seed(0)
    layer = Linear(in_features, out_features, bias=True)
    assert prepack_linears(layer)[0] == out_features * in_features * 4
    return layer


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 15, PACKED_MAX_ROWS, 40, 300])
def test_every_row_count_matches_torch(rows: int) -> None:
    layer = packed_layer(576, 1536)
    x = torch.randn(rows, 576)
    expected = F.linear(x, layer.weight, layer.bias)
    got = layer(x)
    if layer.min_rows <= rows <= layer.max_rows:  # the kernel's or MKL's packed weight
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    else:  # outside the range torch's own kernel runs: bit for bit the same
        assert torch.equal(got, expected)


def test_the_packed_path_really_runs_for_a_verify_sized_step() -> None:
    layer = packed_layer(64, 32)
    x = torch.randn(16, 64)
    assert layer.packed is not None
    expected = F.linear(x, layer.weight, layer.bias)
    # Changing only the weight (not the packed copy) shows which one a step reads.
    with torch.no_grad():
        layer.weight.zero_()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    many = torch.randn(layer.max_rows + 1, 64)  # past the packed rows: the weight itself
    assert torch.equal(layer(many), F.linear(many, layer.weight, layer.bias))


def test_non_fp32_models_are_left_alone() -> None:
    layer = Linear(8, 8).to(torch.bfloat16)
    assert prepack_linears(layer) == (0, "")
    assert layer.packed is None


def test_rows_in_more_dimensions_take_the_packed_weight_too() -> None:
    """A draft step's features are [batch, topk, H]: its rows are few, so the packed copy."""
    layer = packed_layer(64, 32)
    x = torch.randn(2, 4, 64)
    expected = F.linear(x, layer.weight, layer.bias)
    with torch.no_grad():
        layer.weight.zero_()  # as above: only the packed copy still knows the weight
    got = layer(x)
    assert got.shape == (2, 4, 32)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
