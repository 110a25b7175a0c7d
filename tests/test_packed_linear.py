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


def test_exact_refuses_a_model_off_the_kernel_or_out_of_float32() -> None:
    """--exact's numerics are the kernel's, in float32: said at start-up, not found later."""
    with pytest.raises(RuntimeError, match="turned off \\(--no-few-row-kernel\\)"):
        prepack_linears(Linear(64, 64), use_kernel=False, exact=True)
    with pytest.raises((RuntimeError, ValueError), match="--exact"):  # no kernel here: the first
        prepack_linears(Linear(64, 64), exact=True, packed_dtype=torch.bfloat16)


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


def counting_layer(bias: bool) -> tuple[Linear, list[torch.Tensor]]:
    """A layer whose few-row function records what it is handed (x @ weight.T, in float64)."""
    layer = Linear(8, 32, bias=bias)
    seen: list[torch.Tensor] = []

    def few_row(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return (x.double() @ packed.double().T).float()

    layer.packed, layer.few_row, layer.min_rows = layer.weight.detach(), few_row, 1
    layer.max_rows = 4 * PACKED_MAX_ROWS  # as kernel_rows.py may find on a CPU
    return layer, seen


def test_a_step_of_up_to_16_rows_is_one_call_on_its_own_rows() -> None:
    """A decode's or a verify's rows go to the kernel as they are, its answer back as it is
    (no slicing, reshaping or concatenation around the call: on a 2-core CPU those cost a
    decode step of the default model 1.8 of its 14 ms); more rows go 16 at a time."""
    layer, seen = counting_layer(bias=False)
    with torch.inference_mode():
        for rows in (1, 9, PACKED_MAX_ROWS):
            x = torch.randn(rows, 8)
            out = layer(x)
            assert seen[-1] is x
            assert torch.equal(out, (x.double() @ layer.weight.double().T).float())
        seen.clear()
        layer(torch.randn(PACKED_MAX_ROWS + 5, 8))
        assert [len(x) for x in seen] == [PACKED_MAX_ROWS, 5]


def test_a_bias_is_still_added_on_few_rows() -> None:
    layer, _ = counting_layer(bias=True)
    x = torch.randn(3, 8)
    with torch.inference_mode():
        expected = (x.double() @ layer.weight.double().T).float() + layer.bias
        assert torch.equal(layer(x), expected)
