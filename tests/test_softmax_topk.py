"""The draft distribution's kernel (kernels/softmax_topk.py) against torch's softmax + topk, on
CUDA or under Triton's interpreter on CPU (tests/helpers/kernel_checks.py turns it on)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.kernel_checks import DEVICE, DTYPES

kernel = pytest.importorskip("kernels.softmax_topk", reason="triton is not installed")


def _torch_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax + top-k with ties in column order (a stable descending sort's first k)."""
    index = logits.float().sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.softmax(logits.float(), dim=-1).gather(-1, index), index


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", [((1, 8192), 8), ((3, 8, 8192), 8), ((2, 49152), 10),
                                     ((4, 2049), 16), ((2, 7), 7)])  # fmt: skip
def test_matches_torch(dtype, shape: tuple[int, ...], k: int) -> None:
    torch.manual_seed(0)
    # Spread like a draft head's logits; bf16 rounds many of them into ties.
    logits = torch.randn(shape).mul(3.0).to(dtype).to(DEVICE)
    probs, index = kernel.softmax_topk(logits, k)
    want_probs, want_index = _torch_topk(logits, k)
    assert probs.shape == index.shape == (*shape[:-1], k)
    assert probs.dtype == torch.float32 and index.dtype == torch.long
    assert torch.equal(index, want_index)
    torch.testing.assert_close(probs, want_probs, rtol=1e-5, atol=1e-7)


def test_ties_keep_the_lower_column_across_blocks() -> None:
    logits = torch.zeros(2, 3 * kernel.BLOCK + 5, device=DEVICE)
    logits[0, [kernel.BLOCK + 3, 10, 2 * kernel.BLOCK]] = 5.0
    logits[1, [3 * kernel.BLOCK + 4, 2 * kernel.BLOCK + 1]] = 7.0
    logits[1, 9] = 6.0
    probs, index = kernel.softmax_topk(logits, 4)
    assert index[0].tolist()[:3] == [10, kernel.BLOCK + 3, 2 * kernel.BLOCK]
    assert index[1].tolist()[:3] == [2 * kernel.BLOCK + 1, 3 * kernel.BLOCK + 4, 9]
    assert index[1, 3].item() == 0  # then the zeros, lowest column first
    torch.testing.assert_close(probs.sum(-1) <= 1.0, torch.ones(2, dtype=torch.bool, device=DEVICE))
    assert torch.equal(probs[0, 0], probs[0, 2])


def test_every_column_when_k_is_the_width() -> None:
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0]], device=DEVICE)
    probs, index = kernel.softmax_topk(logits, 4)
    assert index.tolist() == [[2, 0, 3, 1]]
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0, device=DEVICE))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="k=5"):
        kernel.softmax_topk(torch.zeros(1, 4, device=DEVICE), 5)
    with pytest.raises(ValueError, match="contiguous"):
        kernel.softmax_topk(torch.zeros(8, 4, device=DEVICE).t(), 2)
