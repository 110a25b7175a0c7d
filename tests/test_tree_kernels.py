"""The Triton tree kernels (kernels/tree_kernels.py) against their torch reference, bit for bit.

Without CUDA the kernels run under Triton's interpreter on CPU tensors (CI); with CUDA the ``gpu``
tests run the compiled kernels on the GPU against the reference on the GPU, including inside a
captured CUDA graph. Every output is poisoned first (filled with values the kernel must overwrite)
so an element the kernel skips cannot pass by matching a fresh allocation.
"""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:  # before kernels.tree_kernels decorates its kernels: they read it then
    os.environ["TRITON_INTERPRET"] = "1"
    for name in ("kernels.tree_kernels", "kernels.tree_compact"):
        if name in sys.modules and not getattr(sys.modules[name], "INTERPRETED", True):
            importlib.reload(sys.modules[name])

from kernels import tree_kernels as tk  # noqa: E402
from kernels import tree_ops  # noqa: E402
from kernels import tree_reference as ref  # noqa: E402
from kernels.tree_reference import Acceptance, TreeMask  # noqa: E402
from tests.test_tree import plant_matches, random_batch, to_tensors  # noqa: E402

DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not tk.INTERPRETED,
            reason="kernels are compiled for CUDA here; the CPU run is the interpreter's (CI)",
        ),
    ),
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not CUDA, reason="needs a CUDA device"),
            pytest.mark.skipif(tk.INTERPRETED, reason="TRITON_INTERPRET=1: compiled kernels off"),
        ],
    ),
]
SEEDS = range(12)  # the interpreter takes ~0.1-0.3 s per call: keeps CI under its budget
VOCAB = 12


def random_trees(seed: int, device: str, dup_rate: float = 0.2):
    """Trees of topk 1-8 and depth 1-6, 1-8 per batch, with padding at random places."""
    rng = random.Random(seed)
    trees = random_batch(rng, rng.randint(1, 8), VOCAB, dup_rate=dup_rate)
    tokens, parents, valid = (t.to(device) for t in to_tensors(trees))
    target_next = torch.tensor([plant_matches(rng, t, VOCAB) for t in trees], device=device)
    start_pos = torch.randint(0, 1000, (len(trees),), device=device)
    return tokens, parents, valid, target_next, start_pos


def poisoned_mask(expected: TreeMask) -> TreeMask:
    return TreeMask(~expected.ancestors, torch.full_like(expected.depths, -7),
                    torch.full_like(expected.positions, -7))


def poisoned_acceptance(expected: Acceptance) -> Acceptance:
    return Acceptance(torch.full_like(expected.path, -2),
                      torch.full_like(expected.num_accepted, -3),
                      torch.full_like(expected.next_token, -5))


def assert_same(got: tuple, expected: tuple) -> None:
    for name, a, b in zip(expected._fields, got, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}: {a} != {b}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", SEEDS)
def test_mask_and_positions_match_reference(seed: int, device: str) -> None:
    _, parents, valid, _, start_pos = random_trees(seed, device)
    expected = ref.tree_mask_and_positions(parents, valid, start_pos)
    out = poisoned_mask(expected)
    assert tk.tree_mask_and_positions(parents, valid, start_pos, out=out) is out
    assert_same(out, expected)
    assert_same(tk.tree_mask_and_positions(parents, valid, start_pos), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_mask_of_a_long_chain(device: str) -> None:
    """Depth 69 in one tree of 70 nodes, beside a root-only tree; several row tiles."""
    chain = torch.arange(-1, 69)
    parents = torch.stack([chain, torch.full_like(chain, 0)]).to(device)
    parents[1, 0] = -1
    valid = torch.ones_like(parents, dtype=torch.bool)
    valid[1, 1:] = False
    start_pos = torch.tensor([5, 9], device=device)
    expected = ref.tree_mask_and_positions(parents, valid, start_pos)
    assert expected.depths[0, -1] == 69
    out = poisoned_mask(expected)
    tk.tree_mask_and_positions(parents, valid, start_pos, out=out)
    assert_same(out, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_accept_path_matches_reference(seed: int, device: str) -> None:
    tokens, parents, valid, target_next, _ = random_trees(100 + seed, device)
    expected = ref.greedy_accept_path(tokens, parents, valid, target_next)
    out = poisoned_acceptance(expected)
    assert tk.greedy_accept_path(tokens, parents, valid, target_next, out=out) is out
    assert_same(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_accepts_a_full_chain_and_nothing(device: str) -> None:
    """A 64-node chain the target follows to the end, and the same chain rejected at once."""
    parents = torch.arange(-1, 63).repeat(2, 1).to(device)
    tokens = torch.arange(64).repeat(2, 1).to(device)
    valid = torch.ones_like(parents, dtype=torch.bool)
    target_next = (tokens + 1).clone()
    target_next[1, 0] = 99
    expected = ref.greedy_accept_path(tokens, parents, valid, target_next)
    assert expected.num_accepted.tolist() == [63, 0]
    out = poisoned_acceptance(expected)
    tk.greedy_accept_path(tokens, parents, valid, target_next, out=out)
    assert_same(out, expected)


def random_pools(rng: torch.Generator, num_rows: int, dtype: torch.dtype, device: str):
    """Two layers of K and V [rows, heads, dim] in ``dtype`` and hidden rows [rows, H] in fp32
    and ``dtype``: random bits (NaN patterns included), so only a bitwise copy matches."""
    shapes = [(num_rows, 3, 8)] * 4 + [(num_rows, 24), (num_rows, 20)]
    dtypes = [dtype] * 4 + [dtype, torch.float32]
    pools = []
    for shape, pool_dtype in zip(shapes, dtypes, strict=True):
        bits = torch.randint(-(2**15), 2**15, shape, generator=rng, dtype=torch.int16)
        raw = bits.view(torch.uint8)
        pools.append(raw.view(pool_dtype).reshape(*shape[:-1], -1).to(device))
    return pools


def as_bits(pool: torch.Tensor) -> torch.Tensor:
    return pool.reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("seed", range(4))
def test_compact_accepted_matches_reference(seed: int, dtype: torch.dtype, device: str) -> None:
    tokens, parents, valid, target_next, _ = random_trees(200 + seed, device, dup_rate=0.0)
    path = ref.greedy_accept_path(tokens, parents, valid, target_next).path
    num_req, num_nodes = path.shape
    rng = torch.Generator().manual_seed(seed)
    num_slots = num_req * num_nodes + 7
    # Each tree owns distinct slots, no two trees share one; the last row is the dummy slot.
    node_slots = torch.randperm(num_slots, generator=rng)[: num_req * num_nodes].view(
        num_req, num_nodes).to(device)
    pools = random_pools(rng, num_slots + 1, dtype, device)
    before = [p.clone() for p in pools]
    expected = [p.clone() for p in pools]
    ref.compact_accepted(expected, node_slots, path, num_slots)
    # The kernel takes int32 slots too (the reference index ops want long).
    tk.compact_accepted(pools, node_slots.to(torch.int32) if seed % 2 else node_slots, path,
                        num_slots)
    for got, want in zip(pools, expected, strict=True):
        assert torch.equal(as_bits(got), as_bits(want))
    moved = (path[:, 1:] >= 0) & (path[:, 1:] != torch.arange(1, num_nodes, device=device))
    changed = [not torch.equal(as_bits(a), as_bits(b)) for a, b in zip(pools, before, strict=True)]
    assert any(changed) == bool(moved.any())  # the kernel moved rows iff the path asks it to


@pytest.mark.parametrize("device", DEVICES)
def test_compact_overlapping_moves(device: str) -> None:
    """Path [0, 2, 3]: node 2 -> slot of node 1 and node 3 -> slot of node 2, whose old row
    must be read before it is overwritten; slots of other nodes and the dummy stay."""
    node_slots = torch.tensor([[10, 11, 12, 13, 14]], device=device)
    path = torch.tensor([[0, 2, 3, -1, -1]], device=device)
    pool = torch.arange(16 * 6, dtype=torch.float32, device=device).view(16, 2, 3)
    expected = pool.clone()
    expected[11], expected[12] = pool[12], pool[13]
    tk.compact_accepted([pool], node_slots, path, 15)
    assert torch.equal(pool, expected)
    with pytest.raises(ValueError, match="dummy slot"):
        tk.compact_accepted([pool], node_slots, path, 16)


@pytest.mark.parametrize("device", DEVICES)
def test_compact_a_long_path_across_rounds(device: str) -> None:
    """A rejected first child, then a 20-node chain the target accepts: every move shifts a row
    one slot down, across several of the kernel's rounds of 8 path entries."""
    parents = torch.tensor([[-1, 0, 0, *range(2, 20)], [-1, 0, 0, 0, 0, *[0] * 16]], device=device)
    tokens = torch.arange(21, device=device).repeat(2, 1)
    target_next = tokens + 1
    target_next[:, 0] = 2  # the root's argmax is node 2's token: node 1 is rejected
    valid = torch.ones_like(parents, dtype=torch.bool)
    valid[1, 5:] = False
    path = ref.greedy_accept_path(tokens, parents, valid, target_next).path
    assert path[0, 1:].tolist() == [*range(2, 21), -1] and path[1, 1] == 2
    rng = torch.Generator().manual_seed(5)
    node_slots = torch.randperm(50, generator=rng)[:42].view(2, 21).to(device)
    pools = random_pools(rng, 51, torch.bfloat16, device)
    expected = [p.clone() for p in pools]
    ref.compact_accepted(expected, node_slots, path, 50)
    tk.compact_accepted(pools, node_slots, path, 50)
    for got, want in zip(pools, expected, strict=True):
        assert torch.equal(as_bits(got), as_bits(want))


@pytest.mark.parametrize("device", DEVICES)
def test_dispatcher_matches_reference(device: str) -> None:
    tokens, parents, valid, target_next, start_pos = random_trees(300, device)
    picked = tree_ops.backend(torch.device(device))
    assert picked is (tk if device == "cuda" else ref)
    assert_same(tree_ops.tree_mask_and_positions(parents, valid, start_pos),
                ref.tree_mask_and_positions(parents, valid, start_pos))
    assert_same(tree_ops.greedy_accept_path(tokens, parents, valid, target_next),
                ref.greedy_accept_path(tokens, parents, valid, target_next))


def test_kernels_compile_for_hopper(tmp_path: Path) -> None:
    """The compiled path, which the interpreter never takes: every kernel variant builds an sm_90
    cubin (Triton's compiler and ptxas, no GPU needed), in a fresh process and cache."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--arch", "90"],
                          env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    built = [line for line in done.stdout.splitlines() if "sm_90 cubin" in line]
    from kernels.compile_check import model_variants, variants

    assert len(built) == len(variants()) + len(model_variants()) > 6, done.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or tk.INTERPRETED, reason="needs a CUDA device and compiled Triton")
def test_kernels_replay_in_a_cuda_graph() -> None:
    """All three kernels captured once, replayed on a new batch of the same shape: equal to the
    reference on that batch (nothing in them syncs with the host or reads a shape on device)."""
    first = list(random_trees(400, "cuda"))
    num_req, num_nodes = first[1].shape
    second = None
    for seed in range(401, 500):  # a batch of the same shape
        candidate = random_trees(seed, "cuda")
        if candidate[1].shape == (num_req, num_nodes):
            second = candidate
            break
    assert second is not None
    gen = torch.Generator().manual_seed(0)
    pools = random_pools(gen, num_req * num_nodes + 1, torch.bfloat16, "cuda")
    slots = torch.randperm(num_req * num_nodes, generator=gen).view(num_req, num_nodes).cuda()
    dummy = num_req * num_nodes

    def step() -> tuple[TreeMask, Acceptance]:
        tokens, parents, valid, target_next, start_pos = first
        mask = tk.tree_mask_and_positions(parents, valid, start_pos)
        accepted = tk.greedy_accept_path(tokens, parents, valid, target_next)
        tk.compact_accepted(pools, slots, accepted.path, dummy)
        return mask, accepted

    start = [p.clone() for p in pools]
    step()  # compiles the kernels and builds the pool table outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mask, accepted = step()
    for static, new in zip(first, second, strict=True):
        static.copy_(new)
    for pool, original in zip(pools, start, strict=True):
        pool.copy_(original)
    graph.replay()
    torch.cuda.synchronize()
    tokens, parents, valid, target_next, start_pos = second
    assert_same(mask, ref.tree_mask_and_positions(parents, valid, start_pos))
    want = ref.greedy_accept_path(tokens, parents, valid, target_next)
    assert_same(accepted, want)
    ref.compact_accepted(start, slots, want.path, dummy)
    for got, expected in zip(pools, start, strict=True):
        assert torch.equal(as_bits(got), as_bits(expected))
