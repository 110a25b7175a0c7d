"""router/target_contract.py: which changes of a returning target's TargetInfo the router follows,
and which make it refuse to serve until restarted."""

from __future__ import annotations

import pytest

from protos import target_pb2
from router.kv_manager import KVManager
from router.multi_step import MultiStep
from router.radix_cache import RadixCache
from router.slot_allocator import SlotAllocator
from router.target_contract import TargetContract

START = dict(
    model_name="m", architecture="LlamaForCausalLM", vocab_size=100, hidden_size=64,
    dtype="bfloat16", max_context_length=2048, num_slots=1000, max_batch_tokens=512,
    max_tree_tokens=64, max_decode_steps=8,
)  # fmt: skip


def contract(router_decode_steps: int = 0) -> TargetContract:
    def fresh_kv(num_slots: int) -> KVManager:
        return KVManager(RadixCache(SlotAllocator(num_slots)), reserve_block=16)

    info = target_pb2.TargetInfo(**START)
    return TargetContract(info, 512, 32, router_decode_steps, fresh_kv)


def back(**changes) -> target_pb2.TargetInfo:
    return target_pb2.TargetInfo(**{**START, **changes})


def test_the_same_target_fits() -> None:
    assert contract().problem(back()) is None


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"model_name": "other"}, "model_name"),
        ({"vocab_size": 101}, "vocab_size"),
        ({"hidden_size": 128}, "hidden_size"),
        ({"dtype": "float32"}, "dtype"),
        ({"max_context_length": 1024}, "max_context_length"),
        ({"max_batch_tokens": 256}, "max_batch_tokens"),
        ({"max_tree_tokens": 16}, "max_tree_tokens"),  # below the router's 32
    ],
)
def test_what_the_router_was_built_on_must_still_hold(changes: dict, named: str) -> None:
    problem = contract().problem(back(**changes))
    assert problem is not None and named in problem


def test_room_to_spare_fits() -> None:
    """Larger limits, another pool size or decode-step cap, a tree limit no longer advertised
    (0), another device: all fit."""
    roomier = back(max_context_length=4096, max_batch_tokens=1024, max_tree_tokens=0,
                   num_slots=50, max_decode_steps=1, device="cpu")  # fmt: skip
    assert contract().problem(roomier) is None


@pytest.mark.parametrize("router_steps,advertised,want", [(0, 2, 2), (0, 16, 16), (4, 2, 2),
                                                          (4, 16, 4)])  # fmt: skip
def test_adopt_follows_the_pool_and_the_decode_step_cap(
    router_steps: int, advertised: int, want: int
) -> None:
    multi_step = MultiStep(8)
    kv = contract(router_steps).adopt(back(num_slots=300, max_decode_steps=advertised), multi_step)
    assert kv.num_total == 300 and kv.available == 300
    assert multi_step.max_steps == want
