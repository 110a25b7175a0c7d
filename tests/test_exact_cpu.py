"""The target's --exact mode on CPU (fp32): a token's bits do not depend on its step.

The C++ paged attention (kernels/exact_attention.h) against its torch reference; the few-row
linear giving one row the same bits alone and inside 2-64 rows; and, on the real default model
in-process (and on the tests' tiny Llama), the hidden rows (hence logits) of a continuation
computed by one-token decodes, by one verify of the chain, and by one prefill chunk beside
another request: equal bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels import few_row_linear, paged_reference
from model_runtime.loading import default_model_path, load_model
from model_runtime.packed_linear import Linear, prepack_linears
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine
from target_service.request_table import SamplingSpec
from tests.helpers.exact_checks import assert_step_kinds_agree
from tests.helpers.prompts import chat_ids
from tests.helpers.spec_fixtures import load_copy
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

UNAVAILABLE = few_row_linear.unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"CPU kernels: {UNAVAILABLE}")
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
NUM_SLOTS = 2048


def cpu_kernels():
    return few_row_linear.load(default_cache_dir())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("head_dim", [64, 24])  # 24: the masked tail past 16 lanes
def test_cpu_attention_matches_reference(seed: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    k_pool, v_pool = (torch.randn(301, 3, head_dim, generator=gen) for _ in range(2))
    table = torch.randint(0, 300, (4, 150), generator=gen)
    lengths = torch.randint(1, 150, (12,), generator=gen)
    prefix = (lengths * torch.rand(12, generator=gen)).long()
    prefix[:4] = lengths[:4]  # decode/prefill queries: every key from the table
    rows = torch.randint(0, 4, (12,), generator=gen)
    path = torch.randint(0, 300, (12, 150), generator=gen)
    q = torch.randn(12, 9, head_dim, generator=gen)
    args = (q, k_pool, v_pool, table, rows, lengths, prefix, path)
    got = cpu_kernels().attention(*args)
    torch.testing.assert_close(got, paged_reference.paged_attention(*args), rtol=1e-5, atol=1e-5)


def test_storing_this_steps_keys_in_the_call_is_index_copy_then_attention() -> None:
    gen = torch.Generator().manual_seed(7)
    k_pool, v_pool = (torch.randn(64, 3, 64, generator=gen) for _ in range(2))
    k_new, v_new = (torch.randn(5, 3, 64, generator=gen) for _ in range(2))
    write_slots = torch.tensor([40, 41, 42, 43, 44])
    table = torch.arange(64).view(1, 64)
    rows, prefix = torch.zeros(5, dtype=torch.long), torch.full((5,), 40)
    lengths, path = torch.arange(41, 46), torch.arange(40, 104).view(1, 64).expand(5, 64)
    q = torch.randn(5, 9, 64, generator=gen)
    step = (table, rows, lengths, prefix, path.contiguous())
    k_copy, v_copy = k_pool.clone(), v_pool.clone()
    k_copy.index_copy_(0, write_slots, k_new)
    v_copy.index_copy_(0, write_slots, v_new)
    want = cpu_kernels().attention(q, k_copy, v_copy, *step)
    got = cpu_kernels().store_and_attend(q, k_new, v_new, write_slots, k_pool, v_pool, *step)
    assert torch.equal(got, want)
    assert torch.equal(k_pool, k_copy) and torch.equal(v_pool, v_copy)
    late = torch.tensor([10, 11, 12, 13, 64])  # the last one past the pool: nothing written
    with pytest.raises(RuntimeError, match="write slot 64 outside the pool"):
        cpu_kernels().store_and_attend(q, k_new, v_new, late, k_pool, v_pool, *step)
    assert torch.equal(k_pool, k_copy) and torch.equal(v_pool, v_copy)


def test_cpu_attention_refuses_bad_tensors() -> None:
    q = torch.randn(2, 9, 64).double()
    with pytest.raises(RuntimeError, match="q: expected a contiguous CPU tensor"):
        cpu_kernels().attention(q, *[torch.zeros(1)] * 7)


def test_a_row_alone_and_inside_2_to_64_rows_has_the_same_bits() -> None:
    linear = Linear(576, 1536, bias=False)
    prepack_linears(linear_holder(linear), default_cache_dir(), exact=True)
    assert linear.all_rows
    x = torch.randn(64, 576)
    with torch.no_grad():
        alone = linear(x[:1])
        for rows in (2, 5, 16, 17, 40, 64):
            assert torch.equal(linear(x[:rows])[:1], alone), f"{rows} rows"
            assert torch.equal(linear(x[:rows])[rows - 1 :], linear(x[rows - 1 : rows]))


def linear_holder(linear: Linear) -> torch.nn.Module:
    holder = torch.nn.Module()
    holder.layer = linear
    return holder


@pytest.fixture(scope="module")
def exact_engine_factory():
    model = load_model(
        default_model_path(), torch.float32, torch.device("cpu"), default_cache_dir()
    )
    prepack_linears(model, default_cache_dir(), exact=True)
    config = TargetConfig(model_path=default_model_path(), cache_dir=default_cache_dir(),
                          num_slots=NUM_SLOTS, attention="paged", exact=True)  # fmt: skip
    return lambda: TargetEngine(config, model)


def test_decode_verify_and_prefill_give_the_same_bits(exact_engine_factory) -> None:
    prompt = list(chat_ids([{"role": "user", "content": "Name three uses of copper."}]))
    other = list(chat_ids([{"role": "user", "content": "What is a prime number?"}]))
    assert_step_kinds_agree(exact_engine_factory, prompt, other, 12, NUM_SLOTS)


def test_the_tiny_model_gives_the_same_bits_in_every_step_kind(engine_model_dir: Path) -> None:
    """The same on the tests' tiny Llama in fp32 (narrow layers: the kernels' ragged tails)."""
    model = load_copy(engine_model_dir, "cpu", torch.float32)
    prepack_linears(model, default_cache_dir(), exact=True)
    config = TargetConfig(model_path=Path("."), cache_dir=default_cache_dir(),
                          num_slots=NUM_SLOTS, attention="paged", exact=True)  # fmt: skip
    prompt, other = [3, 9, 27, 81, 243, 5, 7, 11, 13], [100, 200, 300]
    assert_step_kinds_agree(lambda: TargetEngine(config, model), prompt, other, 12, NUM_SLOTS)


def sampled_run(engine: TargetEngine, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Seeded sampling of every prompt together for ``steps`` steps; request 0 is the probe."""
    slots = iter(range(NUM_SLOTS))
    specs = [SamplingSpec(0.9, 0.95, 40, seed=7 + i) for i in range(len(prompts))]
    items = [StepItem(f"s{i}", p, 0, [next(slots) for _ in p], True, spec)
             for i, (p, spec) in enumerate(zip(prompts, specs, strict=True))]  # fmt: skip
    out = [[t] for t in engine.forward(items).next_token_ids]
    for _ in range(steps):
        step = [StepItem(f"s{i}", [o[-1]], len(p) + len(o) - 1, [next(slots)])
                for i, (p, o) in enumerate(zip(prompts, out, strict=True))]  # fmt: skip
        for o, t in zip(out, engine.forward(step).next_token_ids, strict=True):
            o.append(t)
    return out


def test_a_seeded_request_samples_the_same_whatever_its_neighbours(exact_engine_factory) -> None:
    texts = ["Tell me a story about a fox.", "List some rivers.", "Why do cats purr?"]
    prompts = [list(chat_ids([{"role": "user", "content": t}])) for t in texts]
    alone = sampled_run(exact_engine_factory(), prompts[:1], 16)[0]
    with_neighbours = sampled_run(exact_engine_factory(), prompts, 16)[0]
    assert alone == with_neighbours
