"""Past 16 rows the few-row kernel runs in blocks of 16 up to a limit timed once per CPU and
weight shape (model_runtime/kernel_rows.py), and the verdict is kept in the cache folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import few_row_linear
from model_runtime import kernel_rows
from model_runtime.packed_linear import Linear, prepack_linears

REASON = few_row_linear.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"kernel cannot run here: {REASON}")


def limit_for(cache: Path, shape: tuple[int, int] = (32, 64)) -> int:
    kernel = few_row_linear.load()  # the default cache's build: one build for the whole run
    assert kernel is not None
    torch.manual_seed(0)
    weight = torch.randn(*shape)
    return kernel_rows.row_limit(kernel.linear, weight, kernel.pack(weight), cache)


def test_a_verdict_is_one_of_the_candidates_and_kept_in_the_cache(tmp_path: Path) -> None:
    limit = limit_for(tmp_path)
    assert limit in (kernel_rows.BLOCK_ROWS, *kernel_rows.CANDIDATE_ROWS)
    stored = json.loads((tmp_path / "kernels" / kernel_rows.LIMITS_FILE).read_text())
    [(key, kept)] = stored.items()
    assert kept == limit
    assert key.endswith("|(32, 64)") and f"|{torch.get_num_threads()} threads|" in key
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_later_start_reads_the_verdict_instead_of_timing(tmp_path: Path) -> None:
    limit_for(tmp_path)
    limits_file = tmp_path / "kernels" / kernel_rows.LIMITS_FILE
    stored = json.loads(limits_file.read_text())
    # A verdict no timing gives: only a read of the file can produce it.
    limits_file.write_text(json.dumps(dict.fromkeys(stored, 48)))
    assert limit_for(tmp_path) == 48
    assert limit_for(tmp_path, (16, 64)) != 48  # another shape: timed, and kept beside it
    assert len(json.loads(limits_file.read_text())) == 2


def test_a_bf16_copy_has_a_verdict_of_its_own(tmp_path: Path) -> None:
    """It streams half the bytes, so torch's kernel overtakes it at another row count."""
    kernel = few_row_linear.load()
    assert kernel is not None
    weight = torch.randn(32, 64)
    for packed in (kernel.pack(weight), kernel.pack(weight.bfloat16())):
        kernel_rows.row_limit(kernel.linear, weight, packed, tmp_path)
    keys = sorted(json.loads((tmp_path / "kernels" / kernel_rows.LIMITS_FILE).read_text()))
    assert [key.endswith("|(32, 64)") for key in keys] == [True, False]
    assert keys[1] == keys[0] + "|bfloat16 weights"


def test_prepacking_gives_each_layer_its_shapes_verdict() -> None:
    torch.manual_seed(0)
    layer = Linear(64, 32, bias=True)
    prepack_linears(layer)
    assert layer.few_row is not None
    assert layer.max_rows in (kernel_rows.BLOCK_ROWS, *kernel_rows.CANDIDATE_ROWS)


def test_rows_up_to_the_limit_take_the_packed_weight_each_row_as_if_alone() -> None:
    torch.manual_seed(0)
    layer = Linear(64, 32, bias=True)
    prepack_linears(layer)
    layer.max_rows = 64  # as a CPU where the kernel won up to 64 rows
    x = torch.randn(40, 64)
    expected = F.linear(x, layer.weight, layer.bias)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(40)])
    with torch.no_grad():
        layer.weight.zero_()  # only the packed copy still knows the weight
    got = layer(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, alone)  # a row's bits do not depend on the rows beside it
    past = torch.randn(65, 64)  # past the limit: torch's kernel on the (zeroed) weight
    assert torch.equal(layer(past), F.linear(past, layer.weight, layer.bias))


def test_an_unwritable_cache_only_costs_the_timing(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / kernel_rows.LIMITS_FILE).mkdir()  # the file's name taken: no write
    assert limit_for(tmp_path) in (kernel_rows.BLOCK_ROWS, *kernel_rows.CANDIDATE_ROWS)
    assert not [p for p in (tmp_path / "kernels").iterdir() if p.name.endswith(".tmp")]
