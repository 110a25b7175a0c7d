import pytest

from router.slot_allocator import OutOfSlots, SlotAllocator


def test_allocate_and_free_round_trip() -> None:
    alloc = SlotAllocator(8)
    assert (alloc.num_total, alloc.num_free) == (8, 8)
    slots = alloc.allocate(5)
    assert len(set(slots)) == 5 and all(0 <= s < 8 for s in slots)
    assert alloc.num_free == 3
    assert not any(alloc.is_free(s) for s in slots)
    alloc.free(slots)
    assert alloc.num_free == 8
    assert sorted(alloc.allocate(8)) == list(range(8))


def test_allocate_zero_and_negative() -> None:
    alloc = SlotAllocator(2)
    assert alloc.allocate(0) == []
    with pytest.raises(ValueError):
        alloc.allocate(-1)
    assert alloc.num_free == 2


def test_out_of_slots_allocates_nothing() -> None:
    alloc = SlotAllocator(4)
    alloc.allocate(3)
    with pytest.raises(OutOfSlots, match="asked for 2 KV slots but only 1 of 4 are free"):
        alloc.allocate(2)
    assert alloc.num_free == 1


def test_double_free_raises_and_frees_nothing() -> None:
    alloc = SlotAllocator(4)
    a, b = alloc.allocate(2)
    alloc.free([a])
    with pytest.raises(ValueError, match="double free"):
        alloc.free([b, a])
    assert alloc.num_free == 3 and not alloc.is_free(b)


def test_duplicate_within_one_call_raises() -> None:
    alloc = SlotAllocator(4)
    (a,) = alloc.allocate(1)
    with pytest.raises(ValueError, match="double free"):
        alloc.free([a, a])
    assert alloc.num_free == 3


@pytest.mark.parametrize("slot", [-1, 4, 100])
def test_out_of_range_free_raises(slot: int) -> None:
    alloc = SlotAllocator(4)
    alloc.allocate(4)
    with pytest.raises(ValueError, match="out of range"):
        alloc.free([slot])
    assert alloc.num_free == 0


def test_free_accepts_any_iterable() -> None:
    alloc = SlotAllocator(4)
    slots = alloc.allocate(3)
    alloc.free(s for s in slots)
    assert alloc.num_free == 4


def test_rejects_empty_pool() -> None:
    with pytest.raises(ValueError):
        SlotAllocator(0)
