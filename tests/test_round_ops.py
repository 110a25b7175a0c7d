"""The speculative round's CPU ops (kernels/round_ops.h) against torch, and where the services
take them (model_runtime/fused.py): the target's greedy ids and the accepted path's move give
torch's results exactly; the drafter's softmax top-k gives torch's ids and, within rounding,
its probabilities."""

from __future__ import annotations

import pytest
import torch

from kernels import few_row_linear, tree_reference
from model_runtime import fused

REASON = few_row_linear.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"kernel cannot run here: {REASON}")
VOCAB = 49_152  # the default model's
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def kernel():
    module = few_row_linear.load()
    assert module is not None, "the kernel should build where unavailable_reason() is None"
    return module


class Recorder:
    """The kernel module, noting which of its ops were called: the results are torch's on
    either path, so only this tells that a caller took the row op."""

    def __init__(self, module) -> None:
        self.module, self.called = module, []

    def __getattr__(self, name: str):
        self.called.append(name)
        return getattr(self.module, name)


@pytest.fixture
def round_ops_on(kernel):
    """The process-wide switch, as a CPU engine's kernel load sets it; put back afterwards."""
    before = fused._cpu_rows
    recorder = Recorder(kernel)
    fused.use_cpu_row_ops(recorder)
    yield recorder
    fused.use_cpu_row_ops(before)


@pytest.mark.parametrize("rows, width", [(1, VOCAB), (9, VOCAB), (3, 17), (2, 5), (1, 1)])
def test_argmax_gives_torchs_ids(kernel, rows: int, width: int) -> None:
    torch.manual_seed(width)
    x = torch.randn(rows, width)
    assert torch.equal(kernel.argmax_rows(x), x.argmax(-1))


def test_argmax_takes_the_first_maximum_and_the_first_nan_as_torch_does(kernel) -> None:
    x = torch.randn(5, 100)
    x[0, [5, 50]] = NAN  # two NaNs: the first wins
    x[1] = -INF
    x[2, [7, 70, 93]] = 9.0  # a tie: the first wins
    x[3] = torch.randint(0, 3, (100,)).float()  # many ties
    x[4, 99] = NAN  # in the tail past the last full 16-lane vector
    assert torch.equal(kernel.argmax_rows(x), x.argmax(-1))
    assert kernel.argmax_rows(x).tolist()[:3] == [5, 0, 7]


def test_greedy_ids_take_the_row_op_with_any_leading_dims(round_ops_on) -> None:
    logits = torch.randn(2, 9, 300)
    logits[1, 4, 17] = logits[1, 4, 200] = 50.0
    with torch.inference_mode():
        got = fused.greedy_ids(logits)
    assert got.shape == (2, 9) and torch.equal(got, logits.argmax(-1))
    assert round_ops_on.called == ["argmax_rows"]


def test_greedy_ids_keep_torchs_argmax_without_the_kernel(round_ops_on) -> None:
    fused.use_cpu_row_ops(None)
    logits = torch.randn(3, 40)
    assert torch.equal(fused.greedy_ids(logits), logits.argmax(-1))


SHAPES = [(4, 16_384, 4), (1, 16_384, 8), (3, 20, 20), (2, 33, 1)]  # rows, width, k


@pytest.mark.parametrize("rows, width, k", SHAPES)
def test_softmax_topk_gives_torchs_ids_and_probabilities(kernel, rows: int, width: int, k: int):
    torch.manual_seed(width + k)
    x = torch.randn(rows, width) * 3
    probs, ids = kernel.softmax_topk(x, k)
    want_probs, want_ids = torch.softmax(x, -1).topk(k, -1)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(probs, want_probs, rtol=2e-6, atol=1e-9)


def test_softmax_topk_puts_the_lower_id_first_among_equal_values(kernel) -> None:
    x = torch.zeros(1, 300)
    x[0, [250, 40, 130]] = 2.0
    x[0, 7] = 1.0
    _, ids = kernel.softmax_topk(x, 4)
    assert ids.tolist() == [[40, 130, 250, 7]]


def test_the_drafters_softmax_topk_takes_the_row_op_with_leading_dims(round_ops_on) -> None:
    logits = torch.randn(1, 4, 1000)
    with torch.inference_mode():
        probs, ids = fused.softmax_topk(logits, 3)
    want_probs, want_ids = torch.softmax(logits, -1).topk(3, -1)
    assert probs.shape == ids.shape == (1, 4, 3)
    assert round_ops_on.called == ["softmax_topk"]
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(probs, want_probs, rtol=2e-6, atol=1e-9)


def pools_and_path() -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, int]:
    """A K pool, a V pool and a hidden pool of 40 slots; two requests' trees of 5 nodes
    written at slots 10-14 and 20-24; the first accepted nodes 0, 2, 4, the second only its
    root (the rest of each path -1, padding that moves only the dummy slot 39)."""
    torch.manual_seed(0)
    pools = [torch.randn(40, 3, 64), torch.randn(40, 3, 64), torch.randn(40, 576)]
    node_slots = torch.tensor([list(range(10, 15)), list(range(20, 25))])
    path = torch.tensor([[0, 2, 4, -1, -1], [0, -1, -1, -1, -1]])
    return pools, node_slots, path, 39


def test_the_accepted_paths_move_gives_the_references_bytes(round_ops_on) -> None:
    pools, node_slots, path, dummy = pools_and_path()
    original = [p.clone() for p in pools]
    want = [p.clone() for p in pools]
    tree_reference.compact_accepted(want, node_slots, path, dummy)
    with torch.inference_mode():
        fused.compact_accepted(pools, node_slots, path, dummy)
    assert all(torch.equal(got, w) for got, w in zip(pools, want, strict=True))
    assert round_ops_on.called == ["compact_rows"]
    # node 2's rows now at the path's second slot, node 4's at its third
    assert torch.equal(pools[0][11], original[0][12]) and torch.equal(pools[2][12], original[2][14])


def test_a_move_outside_a_pool_is_refused_before_anything_moves(kernel) -> None:
    pools, _, _, _ = pools_and_path()
    small = torch.randn(8, 4)
    before = [p.clone() for p in (*pools, small)]
    with pytest.raises(RuntimeError, match="outside a pool of 8 rows"):
        kernel.compact_rows([*pools, small], torch.tensor([3, 9]), torch.tensor([4, 5]))
    assert all(torch.equal(p, b) for p, b in zip((*pools, small), before, strict=True))
