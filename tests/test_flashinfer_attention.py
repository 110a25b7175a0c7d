"""`--attention flashinfer` (model_runtime/flashinfer_attention.py) against the torch backend.

The same queries, pools and slots through both: decode tokens beside a prefill chunk in one step,
and batches of random draft trees (topk 1-8, depth 1-6) of different sizes. FlashInfer runs only
on CUDA in fp16/bf16; on a machine without either the tests skip, saying which is missing.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels import tree_ops
from model_runtime import flashinfer_attention, paged
from model_runtime.attention import build_metadata, slot_attention
from tests.test_tree import random_tree

WHY_NOT = flashinfer_attention.unavailable_reason(
    "cuda" if torch.cuda.is_available() else "cpu", "bfloat16"
)
needs_flashinfer = pytest.mark.skipif(WHY_NOT is not None, reason=f"{WHY_NOT}")

SHAPES = [(9, 3, 64), (32, 8, 128)]  # (heads, kv heads, head dim): SmolLM2, Llama-3.1-8B
NUM_SLOTS = 4096
TOLERANCE = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


@pytest.fixture
def flashinfer_kernel():
    paged.use_cuda_kernel("flashinfer")
    yield
    paged.use_cuda_kernel("triton")


def flashinfer_cases(seeds: int):
    """GPU cases on the FlashInfer kernel: both dtypes, both model shapes, ``seeds`` seeds."""
    marks = [
        pytest.mark.parametrize("seed", range(seeds)),
        pytest.mark.parametrize("heads,kv_heads,head_dim", SHAPES),
        pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16]),
        pytest.mark.usefixtures("flashinfer_kernel"),
        needs_flashinfer,
        pytest.mark.gpu,
    ]

    def wrap(test):
        for mark in marks:
            test = mark(test)
        return test

    return wrap


def _pools(kv_heads: int, head_dim: int, dtype, gen):
    shape = (NUM_SLOTS + 1, kv_heads, head_dim)  # the last slot is the dummy
    return [torch.randn(shape, generator=gen).to("cuda", dtype) for _ in range(2)]


def _both(q, k_new, v_new, pools, torch_meta, paged_meta):
    """Each backend on its own copy of the pools (both write the step's K/V first)."""
    outs = []
    for meta in (torch_meta, paged_meta):
        k_pool, v_pool = (p.clone() for p in pools)
        outs.append(slot_attention(q, k_new, v_new, k_pool, v_pool, meta))
    return outs


def _assert_close(got, want):
    rtol, atol = TOLERANCE[want.dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


@flashinfer_cases(seeds=3)
def test_decode_beside_a_prefill_chunk(dtype, heads: int, kv_heads: int, head_dim: int, seed):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    # (context before the step, new tokens): two decodes around a prefill chunk, one fresh prompt.
    shape = [(rng.randint(1, 600), 1), (rng.randint(0, 300), rng.randint(2, 40)),
             (rng.randint(1, 900), 1), (0, rng.randint(1, 30))]  # fmt: skip
    width = max(c + n for c, n in shape)
    table = torch.randperm(NUM_SLOTS, generator=gen)[: len(shape) * width].view(len(shape), width)
    table = table.cuda()
    start = torch.tensor([c for c, _ in shape], device="cuda")
    num_new = torch.tensor([n for _, n in shape], device="cuda")
    rows = torch.repeat_interleave(torch.arange(len(shape), device="cuda"), num_new)
    positions = torch.cat([torch.arange(c, c + n) for c, n in shape]).cuda()
    write = table[rows, positions]
    torch_meta = build_metadata(write, table, start, num_new, int(num_new.max()))
    paged_meta = paged.for_sequences(table, rows, positions, write, NUM_SLOTS)
    q, k_new, v_new = _qkv(len(write), heads, kv_heads, head_dim, dtype, gen)
    want, got = _both(q, k_new, v_new, _pools(kv_heads, head_dim, dtype, gen), torch_meta,
                      paged_meta)  # fmt: skip
    _assert_close(got, want)


@flashinfer_cases(seeds=4)
def test_a_batch_of_random_trees(dtype, heads: int, kv_heads: int, head_dim: int, seed: int):
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    trees = [random_tree(rng, vocab=50) for _ in range(rng.randint(1, 4))]
    num_nodes = max(len(t.parents) for t in trees)
    parents = torch.tensor([t.parents + [0] * (num_nodes - len(t.parents)) for t in trees])
    sizes = torch.tensor([len(t.parents) for t in trees])
    valid = torch.arange(num_nodes)[None, :] < sizes[:, None]
    parents, valid = parents.cuda(), valid.cuda()
    start = torch.tensor([rng.randint(0, 700) for _ in trees], device="cuda")
    width = int(start.max()) + num_nodes
    table = torch.randperm(NUM_SLOTS, generator=gen)[: len(trees) * width].view(len(trees), width)
    table, rows = table.cuda(), torch.arange(len(trees), device="cuda")
    mask = tree_ops.tree_mask_and_positions(parents, valid, start)
    node_slots = table[rows[:, None], start[:, None] + torch.arange(num_nodes, device="cuda")]
    real = valid.flatten()
    torch_meta = build_metadata(node_slots.flatten()[real], table, start, valid.sum(1),
                                num_nodes, new_token_mask=mask.ancestors)  # fmt: skip
    paged_meta = paged.for_trees(table, rows, start, node_slots, mask.ancestors, mask.depths, real)
    q, k_new, v_new = _qkv(int(real.sum()), heads, kv_heads, head_dim, dtype, gen)
    want, got = _both(q, k_new, v_new, _pools(kv_heads, head_dim, dtype, gen), torch_meta,
                      paged_meta)  # fmt: skip
    _assert_close(got, want)


def _qkv(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype, gen):
    q = torch.randn(tokens, heads, head_dim, generator=gen)
    k, v = (torch.randn(tokens, kv_heads, head_dim, generator=gen) for _ in range(2))
    return (t.to("cuda", dtype) for t in (q, k, v))


@pytest.mark.gpu
@needs_flashinfer
def test_one_plan_serves_every_layer_of_a_step() -> None:
    """The plan is made on a step's first call and reused while the metadata is the same."""
    gen = torch.Generator().manual_seed(0)
    table = torch.randperm(NUM_SLOTS, generator=gen)[:64].view(1, 64).cuda()
    positions = torch.tensor([63], device="cuda")
    meta = paged.for_sequences(table, torch.zeros_like(positions), positions, table[0, 63:], 0)
    k_pool, v_pool = _pools(3, 64, torch.bfloat16, gen)
    q = torch.randn(1, 9, 64, generator=gen).to("cuda", torch.bfloat16)
    flashinfer_attention.attention(q, k_pool, v_pool, meta)
    first = flashinfer_attention._last
    flashinfer_attention.attention(q, k_pool, v_pool, meta)
    assert flashinfer_attention._last is first
    other = paged.for_sequences(table, torch.zeros_like(positions), positions, table[0, 63:], 0)
    flashinfer_attention.attention(q, k_pool, v_pool, other)
    assert flashinfer_attention._last is not first


def test_page_lists_name_each_tokens_keys_in_order() -> None:
    """Runs anywhere: a decode token, a prefill token and a tree node's lists."""
    table = torch.tensor([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])
    meta = paged.PagedMetadata(
        write_slots=torch.tensor([14, 22, 31]),
        table=table,
        query_row=torch.tensor([0, 1, 1]),
        query_len=torch.tensor([5, 3, 4]),
        prefix_len=torch.tensor([5, 3, 2]),  # the node: 2 committed keys, then its path
        path=torch.tensor([[0, 0], [0, 0], [30, 31]]),
    )
    indptr, indices = flashinfer_attention.token_page_lists(meta)
    assert indptr.tolist() == [0, 5, 8, 12]
    assert indices.tolist() == [10, 11, 12, 13, 14, 20, 21, 22, 20, 21, 30, 31]
    assert indices.dtype == indptr.dtype == torch.int32


@pytest.mark.parametrize(
    "device,dtype,message",
    [("cpu", "bfloat16", "CUDA only"), ("cuda", "float32", "float16 or bfloat16")],
)
def test_its_limits_are_clear_errors(device: str, dtype: str, message: str) -> None:
    from target_service.config import TargetConfig

    with pytest.raises(ValueError, match=message):
        TargetConfig(model_path=".", cache_dir=".", device=device, dtype=dtype,
                     attention="flashinfer")  # fmt: skip
