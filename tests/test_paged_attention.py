"""The paged attention backend: kernels/paged_attention.py and model_runtime/paged.py.

On CUDA the compiled kernel runs; on CPU Triton's interpreter runs the same kernel code
(TRITON_INTERPRET=1, set before triton is imported), so CI checks it without a GPU. Checked:
the kernel against its torch reference (outputs poisoned first), a token's bits being the same
whichever step computes it (decode, prefill chunk, tree verify, next to any other queries), and
a whole engine on the paged backend against the torch backend.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

ON_CUDA = torch.cuda.is_available()
if not ON_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
kernel = pytest.importorskip("kernels.paged_attention", reason="triton is not installed")

from kernels import few_row_linear, paged_reference, tree_ops  # noqa: E402
from model_runtime import paged  # noqa: E402
from plumbing.paths import default_cache_dir  # noqa: E402
from target_service.config import TargetConfig  # noqa: E402
from target_service.engine import StepItem, TargetEngine, VerifyItem  # noqa: E402
from target_service.request_table import SamplingSpec  # noqa: E402
from tests.helpers.kernel_checks import needs_row_invariant_host_matmul  # noqa: E402
from tests.helpers.spec_fixtures import load_copy  # noqa: E402
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: E402, F401 (fixture)
from tests.test_tree import random_tree  # noqa: E402

DEVICE = "cuda" if ON_CUDA else "cpu"
# An engine on the paged backend runs the C++ kernel on CPU (kernels/exact_attention.h).
needs_paged_engine = pytest.mark.skipif(
    not ON_CUDA and few_row_linear.unavailable_reason() is not None,
    reason=f"the CPU attention kernel cannot run here: {few_row_linear.unavailable_reason()}",
)
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}
SHAPES = [(9, 3, 64), (32, 8, 128)]  # (heads, kv heads, head dim): SmolLM2, Llama-3.1-8B
# (The bits test takes the interpreter 20-30 s a case on the 8B shape: on CPU, SmolLM2's only.)
NUM_SLOTS = 300


def random_pools(num_kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    shape = (NUM_SLOTS + 1, num_kv_heads, head_dim)
    k, v = (torch.randn(shape, generator=gen).to(DEVICE, dtype) for _ in range(2))
    return k, v


def random_queries(rng: random.Random, num_rows: int, width: int) -> list[tuple[int, int, int]]:
    """(table row, keys, prefix) per query: sequence queries (prefix = keys) and tree nodes."""
    out = []
    for _ in range(rng.randint(1, 12)):
        keys = rng.randint(1, width)
        prefix = keys if rng.random() < 0.5 else rng.randint(0, keys - 1)
        out.append((rng.randrange(num_rows), keys, prefix))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_kernel_matches_reference(dtype, heads: int, kv_heads: int, head_dim: int, seed: int):
    rng = random.Random(seed)
    k_pool, v_pool = random_pools(kv_heads, head_dim, dtype, seed)
    table = torch.randint(0, NUM_SLOTS, (4, 150), device=DEVICE)
    queries = random_queries(rng, 4, 150)
    row, length, prefix = (torch.tensor(c, device=DEVICE) for c in zip(*queries, strict=True))
    path = torch.randint(0, NUM_SLOTS, (len(queries), 150), device=DEVICE)
    q = torch.randn(len(queries), heads, head_dim, device=DEVICE).to(dtype)
    out = torch.full_like(q, float("nan"))
    got = kernel.paged_attention(q, k_pool, v_pool, table, row, length, prefix, path, out=out)
    want = paged_reference.paged_attention(q, k_pool, v_pool, table, row, length, prefix, path)
    assert got.data_ptr() == out.data_ptr() and not got.isnan().any()
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def test_one_requests_fixed_shape_tree_metadata_is_laid_out_for_the_kernel() -> None:
    """A fixed-shape verify of one request (real = None) once flattened an expand of its row
    and start into stride-0 views, which the kernel read past their end (an illegal address on
    the H200); the kernel now refuses such views instead of reading them."""
    parents = torch.tensor([[-1, 0, 1, 1]], device=DEVICE)
    valid = torch.ones_like(parents, dtype=torch.bool)
    start = torch.tensor([5], device=DEVICE)
    mask = tree_ops.tree_mask_and_positions(parents, valid, start)
    table = torch.arange(2 * 20, device=DEVICE).view(2, 20)
    node_slots = torch.tensor([[30, 31, 32, 33]], device=DEVICE)
    meta = paged.for_trees(
        table, torch.tensor([1], device=DEVICE), start, node_slots, mask.ancestors, mask.depths,
        None,
    )  # fmt: skip
    per_token = (meta.query_row, meta.query_len, meta.prefix_len, meta.path)
    assert all(t.is_contiguous() for t in per_token)
    assert meta.query_row.tolist() == [1] * 4 and meta.prefix_len.tolist() == [5] * 4
    k_pool, v_pool = random_pools(1, 16, torch.float32, seed=0)
    q = torch.randn(4, 1, 16, device=DEVICE)
    strided_rows = torch.tensor([1], device=DEVICE).expand(4)
    with pytest.raises(ValueError, match="contiguous"):
        kernel.paged_attention(
            q, k_pool, v_pool, table, strided_rows, meta.query_len, meta.prefix_len, meta.path
        )


def tree_and_context(seed: int, committed: int):
    """A random tree (topk 1-8, depth 1-6) whose nodes sit in fresh slots after ``committed``
    context slots, and its deepest root-to-leaf path."""
    tree = random_tree(random.Random(seed), vocab=50)
    parents = torch.tensor([tree.parents], device=DEVICE)
    valid = torch.ones_like(parents, dtype=torch.bool)
    start = torch.tensor([committed], device=DEVICE)
    mask = tree_ops.tree_mask_and_positions(parents, valid, start)
    leaf = int(mask.depths[0].argmax())
    path = [leaf]
    while path[-1] > 0:
        path.append(tree.parents[path[-1]])
    return parents, mask, path[::-1]


@needs_row_invariant_host_matmul
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", SHAPES if ON_CUDA else SHAPES[:1])
def test_a_tokens_bits_do_not_depend_on_its_step(dtype, seed: int, shape) -> None:
    """A tree node's output equals, bit for bit, the same token's output decoded alone and
    prefilled in a chunk once its path is committed, whatever else shares the step; and
    whether its tree's tiles share their context's chunks (a fixed-shape verify) or not."""
    heads, kv_heads, head_dim = shape
    committed = 40 + 60 * seed  # crosses chunk boundaries differently per seed
    parents, mask, path = tree_and_context(seed, committed)
    num_nodes = parents.shape[1]
    k_pool, v_pool = random_pools(kv_heads, head_dim, dtype, seed)
    gen = torch.Generator().manual_seed(seed)
    context = torch.randperm(NUM_SLOTS - num_nodes, generator=gen)[:committed].to(DEVICE)
    node_slots = torch.arange(NUM_SLOTS - num_nodes, NUM_SLOTS, device=DEVICE)[None, :]
    q = torch.randn(num_nodes, heads, head_dim, generator=gen).to(DEVICE, dtype)
    table = torch.full((3, 400), NUM_SLOTS, device=DEVICE)
    table[1, :committed] = context
    real = torch.ones(num_nodes, dtype=torch.bool, device=DEVICE)
    rows = torch.tensor([1], device=DEVICE)
    start = torch.tensor([committed], device=DEVICE)
    tree = paged.for_trees(table, rows, start, node_slots,
                           mask.ancestors, mask.depths, real)  # fmt: skip
    in_tree = attend(q, k_pool, v_pool, tree)
    fixed = paged.for_trees(table, rows, start, node_slots, mask.ancestors, mask.depths, None)
    assert fixed.tile_tokens == num_nodes
    assert torch.equal(attend(q, k_pool, v_pool, fixed), in_tree), "shared tile != unaligned"

    table[2, :committed] = context  # the path committed, as acceptance leaves it
    table[2, committed : committed + len(path)] = node_slots[0, path]
    positions = torch.arange(committed, committed + len(path), device=DEVICE)
    path_q = q[path]
    chunk = paged.for_sequences(table, torch.full_like(positions, 2), positions, positions, 0)
    in_chunk = attend(path_q, k_pool, v_pool, chunk)
    for i, node in enumerate(path):
        neighbour = torch.randn(1, heads, head_dim, generator=gen).to(DEVICE, dtype)
        step_q = torch.cat([neighbour, path_q[i : i + 1]])  # another request's query first
        pos = torch.tensor([committed - 1, committed + i], device=DEVICE)
        decode = paged.for_sequences(table, torch.tensor([1, 2], device=DEVICE), pos, pos, 0)
        alone = attend(step_q, k_pool, v_pool, decode)[1]
        assert torch.equal(alone, in_tree[node]), f"node {node}: decode != tree verify"
        assert torch.equal(alone, in_chunk[i]), f"node {node}: decode != prefill chunk"


def attend(q, k_pool, v_pool, meta: paged.PagedMetadata) -> torch.Tensor:
    """With the tightest grid for each call: the grid's size must not change a token's bits."""
    return kernel.paged_attention(
        q, k_pool, v_pool, meta.table, meta.query_row, meta.query_len, meta.prefix_len, meta.path,
        max_keys=int(meta.query_len.max()), tile_tokens=meta.tile_tokens,
    )  # fmt: skip


GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
PROMPTS = [[3, 9, 27, 81, 243, 5, 7], [11, 13, 17], [100, 200, 300, 400, 500]]


def run_engine(model, attention: str, seed: int, num_trees: int = 3) -> list:
    """Prefills, decodes a few mixed steps, then verifies random trees (one per request, for the
    first ``num_trees`` of the three); returns what came out."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    config = TargetConfig(model_path=Path("."), cache_dir=default_cache_dir(), dtype=dtype,
                          num_slots=NUM_SLOTS, device=DEVICE, attention=attention)  # fmt: skip
    engine = TargetEngine(config, model)
    assert engine.paged == (attention == "paged")
    slot = iter(range(NUM_SLOTS))
    first = engine.forward(
        [StepItem(f"r{i}", p, 0, [next(slot) for _ in p], True, GREEDY)
         for i, p in enumerate(PROMPTS[:2])]
    )  # fmt: skip
    out = [first.next_token_ids]
    lengths = [len(p) for p in PROMPTS[:2]]
    mixed = [StepItem(f"r{i}", [out[-1][i]], lengths[i], [next(slot)]) for i in range(2)]
    mixed.append(StepItem("r2", PROMPTS[2], 0, [next(slot) for _ in PROMPTS[2]], True, GREEDY))
    out.append(engine.forward(mixed).next_token_ids)  # decode tokens beside a prefill chunk
    lengths = [n + 1 for n in lengths] + [len(PROMPTS[2])]
    rng = random.Random(seed)
    trees = [random_tree(rng, vocab=50) for _ in range(num_trees)]
    results, *_ = engine.verify(
        [VerifyItem(f"r{i}", lengths[i], [out[-1][i], *t.tokens[1:]], t.parents,
                    [next(slot) for _ in t.tokens], True) for i, t in enumerate(trees)]
    )  # fmt: skip
    return out + [(r.token_ids, r.hidden) for r in results]


@needs_paged_engine
@pytest.mark.parametrize("seed", range(1))
def test_paged_engine_matches_the_torch_engine(engine_model_dir: Path, seed: int) -> None:
    model = load_copy(engine_model_dir, DEVICE, torch.float32)
    with_torch = run_engine(model, "torch", seed)
    with_paged = run_engine(model, "paged", seed)
    assert with_paged[:2] == with_torch[:2]
    for (ids_p, hidden_p), (ids_t, hidden_t) in zip(with_paged[2:], with_torch[2:], strict=True):
        assert ids_p == ids_t
        torch.testing.assert_close(hidden_p, hidden_t, rtol=1e-4, atol=1e-4)
