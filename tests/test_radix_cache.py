import random
from typing import NamedTuple

import pytest

from router.radix_cache import RadixCache, RadixNode
from router.slot_allocator import OutOfSlots, SlotAllocator


def make_cache(num_slots: int = 32) -> RadixCache:
    return RadixCache(SlotAllocator(num_slots))


def cache_seq(cache: RadixCache, tokens: list[int]) -> list[int]:
    """Allocate slots for ``tokens`` as a fresh request would, insert them, return the slots."""
    slots = cache.allocate(len(tokens))
    assert cache.insert(tokens, slots) == 0
    return slots


def test_empty_cache_matches_nothing() -> None:
    cache = make_cache()
    m = cache.match_prefix([1, 2, 3])
    assert (m.slots, m.length) == ([], 0)
    cache.lock(m.node)  # locking the root is allowed and pins nothing
    cache.unlock(m.node)
    cache.check_integrity(outside_slots=[])


def test_match_full_prefix_and_longer_query() -> None:
    cache = make_cache()
    slots = cache_seq(cache, [1, 2, 3, 4])
    assert cache.match_prefix([1, 2, 3, 4]).slots == slots
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert (m.slots, m.length) == (slots, 4)
    assert cache.match_prefix([2, 1]).length == 0
    cache.check_integrity(outside_slots=[])


def test_match_inside_edge_splits_node() -> None:
    cache = make_cache()
    slots = cache_seq(cache, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 9])
    assert (m.slots, m.length) == (slots[:2], 2)
    assert cache.num_cached_tokens == 4
    # The handle covers exactly the match: locking it pins [1, 2] but not [3, 4].
    cache.lock(m.node)
    assert (cache.num_locked_tokens, cache.num_evictable_tokens) == (2, 2)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3, 4]).slots == slots[:2]
    cache.unlock(m.node)
    cache.check_integrity(outside_slots=[])


def test_insert_returns_cached_prefix_and_frees_duplicates() -> None:
    cache = make_cache(16)
    first = cache_seq(cache, [1, 2, 3])
    # Request A matched [1, 2] and computed [4, 5]: the matched slots go back untouched.
    a = cache.match_prefix([1, 2, 4, 5])
    cache.lock(a.node)
    a_fresh = cache.allocate(2)
    # Request B computed [1, 2, 4, 5] from scratch: all its slots for known tokens are dups.
    b_slots = cache.allocate(4)
    assert cache.insert([1, 2, 4, 5], a.slots + a_fresh) == 2
    cache.unlock(a.node)
    assert cache.insert([1, 2, 4, 5], b_slots) == 4
    assert all(cache.allocator.is_free(s) for s in b_slots)
    assert cache.match_prefix([1, 2, 4, 5]).slots == first[:2] + a_fresh
    assert cache.match_prefix([1, 2, 3]).slots == first
    assert cache.num_cached_tokens == 5 and cache.allocator.num_free == 11
    cache.check_integrity(outside_slots=[])


def test_insert_ending_inside_edge_and_empty_insert() -> None:
    cache = make_cache()
    slots = cache_seq(cache, [1, 2, 3, 4])
    assert cache.insert([1, 2], slots[:2]) == 2
    assert cache.insert([], []) == 0
    assert cache.num_cached_tokens == 4
    cache.check_integrity(outside_slots=[])


def test_insert_length_mismatch() -> None:
    cache = make_cache()
    with pytest.raises(ValueError):
        cache.insert([1, 2], [0])


def test_unlock_below_zero_raises() -> None:
    cache = make_cache()
    cache_seq(cache, [1, 2])
    m = cache.match_prefix([1, 2])
    with pytest.raises(ValueError):
        cache.unlock(m.node)
    cache.lock(m.node)
    cache.lock(m.node)
    cache.unlock(m.node)
    assert cache.num_locked_tokens == 2
    cache.unlock(m.node)
    with pytest.raises(ValueError):
        cache.unlock(m.node)
    assert (cache.num_locked_tokens, cache.num_evictable_tokens) == (0, 2)
    cache.check_integrity()


def test_lru_order() -> None:
    cache = make_cache()
    cache_seq(cache, [1, 1])
    cache_seq(cache, [2, 2])
    cache_seq(cache, [3, 3])
    cache.match_prefix([1, 1])  # touching [1, 1] makes [2, 2] the oldest
    assert cache.evict(1) == 2
    assert cache.match_prefix([2, 2]).length == 0
    assert cache.evict(1) == 2
    assert cache.match_prefix([3, 3]).length == 0
    assert cache.match_prefix([1, 1]).length == 2
    cache.check_integrity(outside_slots=[])


def test_parent_evicted_after_children() -> None:
    cache = make_cache()
    cache_seq(cache, [1, 2, 3])
    cache.insert([1, 2, 4], [*cache.match_prefix([1, 2]).slots, *cache.allocate(1)])
    assert cache.evict(3) == 4  # two one-token leaves, then their two-token parent
    assert cache.num_cached_tokens == 0 and cache.allocator.num_free == 32
    cache.check_integrity(outside_slots=[])


def test_locked_path_survives_eviction() -> None:
    cache = make_cache()
    kept = cache_seq(cache, [1, 2, 3])
    cache.insert([1, 2, 4, 5], [*kept[:2], *cache.allocate(2)])
    m = cache.match_prefix([1, 2, 3])
    cache.lock(m.node)
    assert cache.evict(100) == 2
    assert cache.match_prefix([1, 2, 3]).slots == kept
    # A split below a lock keeps the caller's handle valid.
    cache.match_prefix([1, 7])
    cache.unlock(m.node)
    assert cache.num_locked_tokens == 0
    assert cache.evict(100) == 3
    cache.check_integrity(outside_slots=[])


def test_lock_evicted_node_raises() -> None:
    cache = make_cache()
    cache_seq(cache, [1, 2])
    m = cache.match_prefix([1, 2])
    cache.evict(2)
    with pytest.raises(ValueError):
        cache.lock(m.node)


def test_allocate_evicts_only_when_needed() -> None:
    cache = make_cache(8)
    cache_seq(cache, [1, 2, 3])
    cache_seq(cache, [4, 5, 6])
    held = cache.allocate(2)
    assert cache.num_cached_tokens == 6
    held += cache.allocate(3)  # 0 free: evicts one whole 3-token leaf
    assert cache.num_cached_tokens == 3 and cache.allocator.num_free == 0
    cache.check_integrity(outside_slots=held)


def test_allocate_out_of_slots_evicts_nothing() -> None:
    cache = make_cache(8)
    cache_seq(cache, [1, 2, 3])
    locked = cache_seq(cache, [4, 5, 6])
    m = cache.match_prefix([4, 5, 6])
    cache.lock(m.node)
    with pytest.raises(OutOfSlots, match="3 evictable"):
        cache.allocate(6)
    assert cache.num_cached_tokens == 6
    held = cache.allocate(5)
    assert cache.match_prefix([4, 5, 6]).slots == locked
    cache.check_integrity(outside_slots=held)


# --- Randomized test against a brute-force model -------------------------------------------
# The model maps every cached token prefix (a tuple) to the slot of its last token, so it is
# prefix-closed; a request holds its matched (tree-owned, locked) slots and its fresh slots.


class Request(NamedTuple):
    tokens: list[int]
    node: RadixNode
    matched: list[int]
    fresh: list[int]


class Harness:
    def __init__(self, seed: int, num_slots: int = 48) -> None:
        self.rng = random.Random(seed)
        self.cache = make_cache(num_slots)
        self.model: dict[tuple[int, ...], int] = {}
        self.live: list[Request] = []
        self.bases = [self.rand_tokens(2, 6) for _ in range(6)]

    def rand_tokens(self, lo: int, hi: int) -> list[int]:
        return [self.rng.randrange(3) for _ in range(self.rng.randint(lo, hi))]

    def rand_seq(self) -> list[int]:
        return self.rng.choice(self.bases) + self.rand_tokens(0, 6)

    def model_match(self, tokens: list[int]) -> list[int]:
        slots: list[int] = []
        while tuple(tokens[: len(slots) + 1]) in self.model and len(slots) < len(tokens):
            slots.append(self.model[tuple(tokens[: len(slots) + 1])])
        return slots

    def held(self) -> list[int]:
        return [s for r in self.live for s in r.fresh]

    def sync_evicted(self) -> None:
        """Drop model entries whose slot left the tree (freed, or reallocated to a request)."""
        gone = set(self.held())
        self.model = {k: s for k, s in self.model.items()
                      if not self.cache.allocator.is_free(s) and s not in gone}

    def start(self) -> None:
        tokens = self.rand_seq()
        m = self.cache.match_prefix(tokens if self.rng.random() < 0.8 else [])
        assert m.slots == self.model_match(tokens)[: m.length]
        self.cache.lock(m.node)
        need, room = len(tokens) - m.length, self.cache.allocator.num_free
        room += self.cache.num_evictable_tokens
        cached = self.cache.num_cached_tokens
        try:
            fresh = self.cache.allocate(need)
        except OutOfSlots:
            assert need > room and self.cache.num_cached_tokens == cached
            self.cache.unlock(m.node)
            return
        self.live.append(Request(tokens, m.node, m.slots, fresh))
        self.sync_evicted()

    def finish(self) -> None:
        req = self.live.pop(self.rng.randrange(len(self.live)))
        slots = req.matched + req.fresh
        expected_prefix = len(self.model_match(req.tokens))
        assert self.cache.insert(req.tokens, slots) == expected_prefix
        self.cache.unlock(req.node)
        for i, slot in enumerate(slots):
            key = tuple(req.tokens[: i + 1])
            if key not in self.model:
                self.model[key] = slot
            elif self.model[key] != slot:
                assert self.cache.allocator.is_free(slot), "duplicate slot not freed"

    def abort(self) -> None:
        req = self.live.pop(self.rng.randrange(len(self.live)))
        self.cache.allocator.free(req.fresh)
        self.cache.unlock(req.node)

    def evict(self) -> None:
        want, evictable = self.rng.randint(1, 20), self.cache.num_evictable_tokens
        freed = self.cache.evict(want)
        assert min(want, evictable) <= freed <= evictable
        self.sync_evicted()

    def probe(self) -> None:
        tokens = self.rand_seq()
        assert self.cache.match_prefix(tokens).slots == self.model_match(tokens)

    def check(self) -> None:
        cache, held = self.cache, self.held()
        cache.check_integrity(outside_slots=held)
        assert cache.allocator.num_free + cache.num_cached_tokens + len(held) == 48
        assert len(self.model) == cache.num_cached_tokens
        assert all(k[:-1] in self.model for k in self.model if len(k) > 1), "not prefix-closed"
        owned = list(self.model.values()) + held
        assert len(set(owned)) == len(owned), "a slot is owned twice"
        for req in self.live:  # locked prefixes survived every eviction so far
            assert self.model_match(req.tokens)[: len(req.matched)] == req.matched
        maximal = [list(k) for k in self.model if not any(k + (t,) in self.model for t in range(3))]
        self.rng.shuffle(maximal)
        for tokens in maximal:
            assert self.cache.match_prefix(tokens).slots == self.model_match(tokens)

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.35 or not self.live and r < 0.55:
            self.start()
        elif r < 0.65 and self.live:
            self.finish()
        elif r < 0.7 and self.live:
            self.abort()
        elif r < 0.85:
            self.evict()
        else:
            self.probe()
        self.check()


@pytest.mark.parametrize("seed", range(6))
def test_randomized_against_model(seed: int) -> None:
    harness = Harness(seed)
    for _ in range(400):
        harness.step()
    while harness.live:
        harness.finish()
        harness.check()
    harness.cache.evict(10**6)
    assert harness.cache.num_cached_tokens == 0 and harness.cache.allocator.num_free == 48
