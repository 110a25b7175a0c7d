"""The EAGLE head on a CPU in fp32 runs its few-row steps on prepacked weights, as the target
does (draft_service/eagle/factory.py): the shipped head over the default model, built the way
the draft service builds it."""

from __future__ import annotations

import argparse

import pytest
import torch

from draft_service import arguments
from draft_service.drafter import ContextChunk, TreeShape
from draft_service.eagle.drafter import EagleDrafter
from draft_service.eagle.factory import build_eagle_drafter
from draft_service.tree_types import DraftTree
from kernels import few_row_linear
from model_runtime import quantized_pack
from model_runtime.packed_linear import Linear, can_prepack
from plumbing.paths import default_cache_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not can_prepack(torch.zeros(1)), reason="this torch build has no MKL packed sgemm"
    ),
]
SHAPE = TreeShape(5, 4, 16)  # the CPU default before 2026-12-06 (16 rows: the kernel's most)


def drafter(prepack: bool, packed_weights: str = "float32") -> EagleDrafter:
    built = build_eagle_drafter(
        None, None, default_cache_dir(), SHAPE, "float32", "cpu", num_slots=512,
        prepack=prepack, packed_weights=packed_weights,
    )  # fmt: skip
    assert isinstance(built, EagleDrafter)
    return built


@pytest.fixture(scope="module")
def packed() -> EagleDrafter:
    return drafter(prepack=True)


@pytest.fixture(scope="module")
def packed_bf16() -> EagleDrafter:
    return drafter(prepack=True, packed_weights="bfloat16")


@pytest.fixture(scope="module")
def unpacked() -> EagleDrafter:
    return drafter(prepack=False)


def linears(drafter: EagleDrafter) -> dict[str, Linear]:
    return {name: m for name, m in drafter.head.named_modules() if isinstance(m, Linear)}


def test_every_linear_of_the_head_is_packed_the_hot_head_included(
    packed: EagleDrafter, unpacked: EagleDrafter
) -> None:
    names = linears(packed)
    assert {"fc", "hot_head", "layers.0.self_attn.q_proj", "layers.0.mlp.down_proj"} <= set(names)
    assert all(m.packed is not None for m in names.values())
    assert all(m.packed is None for m in linears(unpacked).values())


def test_a_draft_step_reads_the_packed_hot_head(packed: EagleDrafter) -> None:
    """A step of the tree search ([1, topk, H] features) projects onto the hot vocabulary
    through the packed copy: with the weight itself zeroed it still gives the same draft."""
    head, hot_head = packed.head, packed.head.hot_head
    assert hot_head is not None
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(1, SHAPE.topk, head.hidden_size, generator=generator)
    with torch.inference_mode():
        before = head.draft_distribution(features, SHAPE.topk)
        kept = hot_head.weight.detach().clone()
        hot_head.weight.detach().zero_()
        try:
            after = head.draft_distribution(features, SHAPE.topk)
        finally:
            hot_head.weight.detach().copy_(kept)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def first_trees(drafters: list[EagleDrafter], seed: int) -> list[DraftTree]:
    """Each drafter's tree for the same random context of 64 tokens and hidden rows."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 49152, (65,), generator=gen).tolist()
    hidden = torch.randn(64, drafters[0].head.hidden_size, generator=gen)
    trees = []
    for each in drafters:
        each.append(ContextChunk("r", 0, tokens, 0, hidden))
        trees.append(each.propose(["r"])[0])
        each.release("r")
    return trees


def test_packed_and_unpacked_heads_draft_alike(
    packed: EagleDrafter, unpacked: EagleDrafter
) -> None:
    """Packing changes the rounding of the drafts' probabilities, not what they are."""
    first, second = first_trees([packed, unpacked], seed=1)
    assert first.num_nodes == second.num_nodes == SHAPE.num_draft_tokens
    assert (first.token_ids, first.parent_indices) == (second.token_ids, second.parent_indices)
    assert first.scores is not None and second.scores is not None
    torch.testing.assert_close(torch.tensor(first.scores), torch.tensor(second.scores))


@pytest.mark.skipif(few_row_linear.unavailable_reason() is not None,
                    reason="bf16 and quantized copies are the few-row kernel's, which cannot run "
                    f"here: {few_row_linear.unavailable_reason()}")  # fmt: skip
def test_a_head_packed_in_bf16_drafts_as_torch_does_on_its_rounded_weights(
    packed_bf16: EagleDrafter, unpacked: EagleDrafter
) -> None:
    """The service's default: the kernel reads bf16 copies (half the bytes a draft step
    streams), and the head's fp32 weights hold the same values, so a head without packing but
    with those weights drafts the same tree. The hot-vocabulary head's rows are the default
    model's Q8_0 LM head: its copy is those blocks, and its weights stay as they are."""
    kinds = {name: quantized_pack.kind(m.packed) for name, m in linears(packed_bf16).items()}
    assert kinds.pop("hot_head") == "q8_0" and set(kinds.values()) == {"bfloat16"}
    for name, module in linears(packed_bf16).items():
        if name != "hot_head":
            assert torch.equal(module.weight, module.weight.bfloat16().float())
    rounded = drafter(prepack=False)
    with torch.no_grad():
        for name, module in linears(rounded).items():
            module.weight.copy_(linears(packed_bf16)[name].weight)
    first, second = first_trees([packed_bf16, rounded], seed=2)
    assert (first.token_ids, first.parent_indices) == (second.token_ids, second.parent_indices)
    # The rounding is real: the fp32 head's weights differ; the hot head's do not.
    assert not torch.equal(linears(unpacked)["fc"].weight, linears(packed_bf16)["fc"].weight)
    hot = [linears(each)["hot_head"].weight for each in (unpacked, packed_bf16)]
    assert torch.equal(*hot)


@pytest.mark.skipif(few_row_linear.unavailable_reason() is not None,
                    reason=f"CPU kernels: {few_row_linear.unavailable_reason()}")  # fmt: skip
def test_the_paged_attention_drafts_as_torchs_does(packed: EagleDrafter) -> None:
    """On a CPU in fp32 the factory puts the head's eager steps (the append and the tree
    search) on the target's paged attention kernel, which reads the keys in place; only the
    rounding of the attention differs from torch's gather, not the drafts."""
    assert packed.paged_eager
    with_kernel = first_trees([packed], seed=3)[0]
    packed.paged_eager = False
    try:
        with_torch = first_trees([packed], seed=3)[0]
    finally:
        packed.paged_eager = True
    assert with_kernel.token_ids == with_torch.token_ids
    assert with_kernel.parent_indices == with_torch.parent_indices
    assert with_kernel.scores is not None and with_torch.scores is not None
    torch.testing.assert_close(torch.tensor(with_kernel.scores), torch.tensor(with_torch.scores))


def test_the_service_flag_turns_packing_off() -> None:
    parser = argparse.ArgumentParser()
    arguments.add_arguments(parser)
    on = arguments.config_from_args(parser.parse_args(["--method", "eagle", "--device", "cpu"]))
    off = arguments.config_from_args(
        parser.parse_args(["--method", "eagle", "--device", "cpu", "--no-prepack"])
    )
    assert on.prepack_weights and not off.prepack_weights
    assert on.few_row_kernel
    assert on.packed_weights == "bfloat16"  # the default: half the bytes a draft step reads
    fp32 = parser.parse_args(["--method", "eagle", "--packed-weights", "float32"])
    assert arguments.config_from_args(fp32).packed_weights == "float32"
