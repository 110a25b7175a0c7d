"""The CPU kernels built for AVX2 give the AVX-512 build's bits (kernels/simd16.h).

Both builds run the same 16-lane code: lane-wise operations, and sums across lanes by one fixed
tree (the AVX2 build copies GCC's AVX-512 reduction). So a machine's outputs must not depend on
which of the two it built, which this checks op by op on random inputs. It needs a CPU with
AVX-512, where both builds run; on an AVX2-only CPU the AVX-512 build cannot run at all.
"""

from __future__ import annotations

import pytest
import torch

from kernels import few_row_linear
from tests.test_quantized_pack import q4_1_weight, q8_0_weight

pytestmark = pytest.mark.skipif(
    few_row_linear.instruction_set() != "avx512" or few_row_linear.unavailable_reason() is not None,
    reason="needs a CPU with AVX-512 to run both builds; this one builds for "
    f"{few_row_linear.instruction_set() or 'neither'}",
)


@pytest.fixture(scope="module")
def builds():
    wide, narrow = few_row_linear.load(), few_row_linear.load(isa="avx2")
    assert wide is not None and narrow is not None
    return wide, narrow


def test_each_build_says_the_rows_a_pass_takes(builds) -> None:
    wide, narrow = builds
    assert (wide.rows_per_pass(), narrow.rows_per_pass()) == (
        few_row_linear.ROWS_PER_PASS["avx512"], few_row_linear.ROWS_PER_PASS["avx2"])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))  # fmt: skip


def both(builds, op: str, *args):
    return [getattr(module, op)(*args) for module in builds]


@pytest.mark.parametrize("rows", [1, 3, 9, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_on_fp32_and_bf16_copies(builds, rows, dtype) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 200, generator=gen).to(dtype)
    x = torch.randn(rows, 200, generator=gen)
    wide, narrow = (module.linear(x, module.pack(weight)) for module in builds)
    assert same_bits(wide, narrow)


@pytest.mark.parametrize(("make", "bits"), [(q4_1_weight, 4), (q8_0_weight, 8)])
def test_linear_on_quantized_copies(builds, make, bits) -> None:
    weight = make(64, 256, seed=bits)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(bits))
    packs = [module.pack_quantized(weight, bits) for module in builds]
    assert same_bits(*packs) and packs[0].numel() > 0
    wide, narrow = (m.linear(x, pack) for m, pack in zip(builds, packs, strict=True))
    assert same_bits(wide, narrow)


@pytest.mark.parametrize("head_dim", [64, 48])  # registers, and the masked any-dim path
def test_paged_attention(builds, head_dim) -> None:
    gen = torch.Generator().manual_seed(head_dim)
    pools = [torch.randn(256, 3, head_dim, generator=gen) for _ in range(2)]
    table = torch.randint(0, 200, (2, 64), generator=gen)
    tokens = 6
    q = torch.randn(tokens, 9, head_dim, generator=gen)
    rows = torch.tensor([0, 1, 1, 1, 1, 1])
    lengths = torch.tensor([37, 20, 21, 21, 22, 23])
    prefixes = torch.tensor([37, 19, 19, 19, 19, 19])
    path = torch.tensor([[0, 0, 0, 0], [250, 0, 0, 0], [250, 251, 0, 0], [250, 252, 0, 0],
                         [250, 251, 253, 0], [250, 251, 253, 254]])  # fmt: skip
    wide, narrow = both(builds, "attention", q, *pools, table, rows, lengths, prefixes, path)
    assert same_bits(wide, narrow)


def test_row_ops(builds) -> None:
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(7, 584, generator=gen), torch.randn(584, generator=gen)
    assert same_bits(*both(builds, "rms_norm", x, weight, 1e-5))
    heads = torch.randn(5, 9, 64, generator=gen)
    cos, sin = torch.randn(5, 1, 64, generator=gen), torch.randn(5, 1, 64, generator=gen)
    assert same_bits(*both(builds, "rotary", heads, cos, sin))


def test_round_ops(builds) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 16_389, generator=gen) * 4
    logits[1, 77] = float("nan")
    logits[2, 5:9] = 50.0  # ties: the first one
    assert same_bits(*both(builds, "argmax_rows", logits))
    (wide_probs, wide_ids), (narrow_probs, narrow_ids) = both(builds, "softmax_topk", logits, 10)
    assert same_bits(wide_ids, narrow_ids) and same_bits(wide_probs, narrow_probs)
