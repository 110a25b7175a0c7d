"""The CPU paged attention kernel's tiles (kernels/exact_attention.h): a token's output has the
same bits whatever shares its step.

The kernel reads the keys that all tokens of a tile see once for the tile, and sums each key's
16 lanes together with 15 other keys'. Neither may change a token's bits: a tree node verified
with 1 to 40 others (tiles of up to 8, cut where another request's tokens come between) must
equal the same node attended alone, and equal the same token prefilled in a chunk once its path
is committed; with contexts that end inside a block of 16 keys and on its edge. And the
target's --attention auto takes the kernel on CPU only for a float32 model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import few_row_linear, paged_reference
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import TargetEngine
from tests.helpers.spec_fixtures import load_copy
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

UNAVAILABLE = few_row_linear.unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"CPU kernels: {UNAVAILABLE}")
NUM_SLOTS, WIDTH, HEADS, KV_HEADS = 1024, 256, 9, 3


def attend(q, pools, table, rows, lengths, prefixes, path):
    kernel = few_row_linear.load(default_cache_dir())
    args = (q.contiguous(), *pools, table, rows, lengths, prefixes, path.contiguous())
    return kernel.attention(*args)


def random_tree(gen: torch.Generator, size: int) -> list[list[int]]:
    """Each node's path from the root, root first, ending with itself (parents precede)."""
    paths = [[0]]
    for node in range(1, size):
        parent = int(torch.randint(0, node, (1,), generator=gen))
        paths.append([*paths[parent], node])
    return paths


def tree_metadata(context: int, node_slots, paths):
    """Rows, lengths, prefixes and paths of a tree's nodes in row 1 after ``context`` keys."""
    size = len(paths)
    path = torch.zeros(size, max(map(len, paths)), dtype=torch.long)
    for i, p in enumerate(paths):
        path[i, : len(p)] = node_slots[p]
    lengths = torch.tensor([context + len(p) for p in paths])
    return torch.ones(size, dtype=torch.long), lengths, torch.full((size,), context), path


def tree_step(q, pools, table, context: int, node_slots, paths, neighbour_q=None):
    """The tree's nodes verified in one step (row 1), after one decode token of row 0."""
    rows, lengths, prefixes, path = tree_metadata(context, node_slots, paths)
    if neighbour_q is None:
        return attend(q, pools, table, rows, lengths, prefixes, path)
    one = torch.tensor([0])
    out = attend(torch.cat([neighbour_q, q]), pools, table, torch.cat([one, rows]),
                 torch.cat([one + 50, lengths]), torch.cat([one + 50, prefixes]),
                 torch.cat([torch.zeros_like(path[:1]), path]))  # fmt: skip
    return out[1:]


@pytest.mark.parametrize("context", [37, 48, 130])
@pytest.mark.parametrize("size", [1, 7, 17, 41])
def test_a_tree_nodes_bits_alone_in_its_tree_and_in_a_prefill_chunk(context, size) -> None:
    gen = torch.Generator().manual_seed(context * 100 + size)
    pools = [torch.randn(NUM_SLOTS, KV_HEADS, 64, generator=gen) for _ in range(2)]
    table = torch.randint(0, NUM_SLOTS // 2, (3, WIDTH), generator=gen)
    node_slots = torch.arange(NUM_SLOTS - size, NUM_SLOTS)
    paths = random_tree(gen, size)
    q = torch.randn(size, HEADS, 64, generator=gen)
    in_tree = tree_step(q, pools, table, context, node_slots, paths)
    beside = tree_step(q, pools, table, context, node_slots, paths, torch.randn(1, HEADS, 64))
    assert torch.equal(in_tree, beside), "another request's token changed the tree's bits"
    for node in range(size):
        one = slice(node, node + 1)
        alone = tree_step(q[one], pools, table, context, node_slots, paths[one])
        assert torch.equal(alone[0], in_tree[node]), f"node {node}: alone != in its tree"
    leaf = paths[-1]  # commit the last node's path after the context, then prefill it
    table[2, :context] = table[1, :context]
    table[2, context : context + len(leaf)] = node_slots[leaf]
    positions = torch.arange(context, context + len(leaf))
    chunk = attend(q[leaf], pools, table, torch.full_like(positions, 2), positions + 1,
                   positions + 1, torch.zeros(len(leaf), 1, dtype=torch.long))  # fmt: skip
    assert torch.equal(chunk, in_tree[leaf]), "a prefill chunk != the tree verify"
    torch.testing.assert_close(in_tree, reference(q, pools, table, context, node_slots, paths),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def reference(q, pools, table, context, node_slots, paths):
    metadata = tree_metadata(context, node_slots, paths)
    return paged_reference.paged_attention(q, *pools, table, *metadata)


def test_a_token_with_no_keys_gets_zeros_not_nans() -> None:
    q = torch.randn(2, HEADS, 64)
    pools = [torch.randn(8, KV_HEADS, 64) for _ in range(2)]
    table = torch.arange(8)[None]
    zero = torch.zeros(2, dtype=torch.long)
    out = attend(q, pools, table, zero, torch.tensor([0, 3]), torch.tensor([0, 3]),
                 torch.zeros(2, 1, dtype=torch.long))  # fmt: skip
    assert torch.equal(out[0], torch.zeros(HEADS, 64))
    assert torch.isfinite(out[1]).all()


def test_auto_attention_takes_the_kernel_for_float32_models_only(engine_model_dir: Path) -> None:
    def engine(dtype: torch.dtype, attention: str = "auto") -> TargetEngine:
        config = TargetConfig(Path("."), default_cache_dir(), num_slots=64, attention=attention)
        return TargetEngine(config, load_copy(engine_model_dir, "cpu", dtype))

    assert engine(torch.float32).paged
    assert not engine(torch.float64).paged  # torch's attention serves other dtypes
    with pytest.raises(ValueError, match="paged attention backend on CPU is float32"):
        engine(torch.float64, attention="paged")
