"""Radix tree over token-id sequences whose nodes own the KV slots of their tokens.

Ownership model (page size 1, one slot per token):
  * a slot is owned by exactly one of: the allocator's free pool, this tree, or a request;
  * ``allocate`` hands fresh slots to a request; ``insert`` moves a request's slots into the
    tree (or back to the pool when the tree already has those tokens); ``evict`` moves tree
    slots back to the pool;
  * slots returned by ``match_prefix`` still belong to the tree. They are safe to use only
    while the matched node is locked: an unlocked node may be evicted by any later call that
    evicts (``evict``, ``allocate``) and its slots reused for other tokens.
"""

import heapq
import itertools
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from router.slot_allocator import OutOfSlots, SlotAllocator


class RadixNode:
    """One edge of the tree: ``key`` tokens stored in ``slots`` (same length).

    Opaque to callers, who only pass it back to ``lock``/``unlock``. ``ref_count`` counts the
    locks held on this node or any node below it, so it never increases going down the tree.
    """

    __slots__ = ("key", "slots", "parent", "children", "ref_count", "last_access", "node_id")

    def __init__(
        self,
        key: list[int],
        slots: list[int],
        parent: "RadixNode | None",
        node_id: int,
        last_access: int,
    ) -> None:
        self.key = key
        self.slots = slots
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self.ref_count = 0
        self.last_access = last_access
        self.node_id = node_id


class PrefixMatch(NamedTuple):
    """Longest cached prefix of a query.

    ``slots[i]`` holds token ``i`` of the query; ``length == len(slots)``. ``node`` is the
    deepest matched node (the root when ``length == 0``); lock it to pin ``slots``.
    """

    node: RadixNode
    slots: list[int]
    length: int


class RadixCache:
    """Prefix cache with reference counts and LRU eviction of unlocked leaves.

    Invariants (checked by ``check_integrity``):
      * every non-root node has a non-empty key, ``len(key) == len(slots)``, and is stored in
        its parent's ``children`` under ``key[0]``;
      * a node with ``ref_count > 0`` is locked and is never evicted; since a lock counts on the
        whole path to the root, a locked node's ancestors are locked too;
      * ``_evictable_leaves`` is exactly the set of non-root leaves with ``ref_count == 0``;
      * no slot appears twice in the tree, and no tree slot is free in the allocator.
    """

    def __init__(self, allocator: SlotAllocator) -> None:
        self._allocator = allocator
        self._ids = itertools.count()
        # A logical clock rather than wall time: deterministic, and ties cannot happen.
        self._clock = itertools.count(1)
        self._root = RadixNode([], [], None, next(self._ids), 0)
        self._evictable_leaves: set[RadixNode] = set()
        self._num_evictable = 0
        self._num_locked = 0

    @property
    def allocator(self) -> SlotAllocator:
        return self._allocator

    @property
    def num_cached_tokens(self) -> int:
        return self._num_evictable + self._num_locked

    @property
    def num_evictable_tokens(self) -> int:
        """Tokens in unlocked nodes; ``evict`` can free all of them."""
        return self._num_evictable

    @property
    def num_locked_tokens(self) -> int:
        return self._num_locked

    def match_prefix(self, token_ids: Sequence[int]) -> PrefixMatch:
        """Find the longest cached prefix of ``token_ids`` and mark its path recently used.

        Splits a node when the match ends inside its edge, so ``node`` covers exactly the
        match. The returned slots are safe to use only while ``node`` is locked. Callers that
        must compute at least one token (to get logits) should pass ``token_ids[:-1]``.
        """
        now = next(self._clock)
        node, pos = self._root, 0
        slots: list[int] = []
        node.last_access = now
        # After a split the next lookup misses (the lower part starts with another token).
        while pos < len(token_ids) and (child := node.children.get(token_ids[pos])) is not None:
            m = _common_len(child.key, token_ids, pos)
            if m < len(child.key):
                child = self._split(child, m)
            child.last_access = now
            slots.extend(child.slots)
            node, pos = child, pos + m
        return PrefixMatch(node, slots, pos)

    def lock(self, node: RadixNode) -> None:
        """Pin ``node`` and its ancestors against eviction; pair every call with ``unlock``."""
        if node.parent is None and node is not self._root:
            raise ValueError("cannot lock a node that has been evicted")
        cur: RadixNode | None = node
        while cur is not None:
            if cur.ref_count == 0 and cur is not self._root:
                self._num_evictable -= len(cur.key)
                self._num_locked += len(cur.key)
                self._evictable_leaves.discard(cur)
            cur.ref_count += 1
            cur = cur.parent

    def unlock(self, node: RadixNode) -> None:
        """Undo one ``lock(node)``. Raises ValueError (changing nothing) if it is not locked."""
        # Ancestors' counts are >= node's, so checking node alone keeps this all-or-nothing.
        if node.ref_count <= 0:
            raise ValueError("unlock of a node that is not locked")
        cur: RadixNode | None = node
        while cur is not None:
            cur.ref_count -= 1
            if cur.ref_count == 0 and cur is not self._root:
                self._num_locked -= len(cur.key)
                self._num_evictable += len(cur.key)
                if not cur.children:
                    self._evictable_leaves.add(cur)
            cur = cur.parent

    def insert(self, token_ids: Sequence[int], slots: Sequence[int]) -> int:
        """Cache ``token_ids`` stored in ``slots``; return how many leading tokens were cached.

        Takes ownership of every passed slot. For the already-cached prefix the tree keeps its
        own slots; a passed slot equal to the tree's one (the caller got it from
        ``match_prefix``) stays in the tree, any other one is a duplicate computation and is
        returned to the allocator. Duplicates are freed after the tree is updated, so a
        ValueError from the allocator here means the caller passed a slot it did not own.
        """
        if len(token_ids) != len(slots):
            raise ValueError(f"{len(token_ids)} tokens but {len(slots)} slots")
        now = next(self._clock)
        node, pos = self._root, 0
        duplicates: list[int] = []
        node.last_access = now
        while pos < len(token_ids):
            child = node.children.get(token_ids[pos])
            if child is None:
                self._add_leaf(node, list(token_ids[pos:]), list(slots[pos:]), now)
                break
            m = _common_len(child.key, token_ids, pos)
            if m < len(child.key):
                child = self._split(child, m)
            mine = slots[pos : pos + m]
            duplicates.extend(s for s, t in zip(mine, child.slots, strict=True) if s != t)
            child.last_access = now
            node, pos = child, pos + m
        self._allocator.free(duplicates)
        return pos

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots, or all evictable ones if there are fewer.

        Removes whole unlocked leaves in least-recently-used order; a parent becomes a
        candidate once its last child is gone. Returns the number of slots freed.
        """
        # The candidate set is maintained incrementally, so a call costs O(leaves + k log leaves)
        # for k evicted nodes, never a tree walk; node_id breaks ties deterministically.
        heap = [(n.last_access, n.node_id, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        num_freed = 0
        while num_freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = self._remove_leaf(leaf)
            num_freed += len(leaf.key)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        return num_freed

    def allocate(self, n: int) -> list[int]:
        """Allocate ``n`` fresh slots, evicting first if the pool is short.

        Raises OutOfSlots, evicting nothing, when free plus evictable slots are fewer than n.
        """
        shortfall = n - self._allocator.num_free
        if shortfall > 0:
            if shortfall > self._num_evictable:
                raise OutOfSlots(
                    f"asked for {n} KV slots: {self._allocator.num_free} free, "
                    f"{self._num_evictable} evictable, {self._num_locked} locked in the cache"
                )
            self.evict(shortfall)
        return self._allocator.allocate(n)

    def check_integrity(self, outside_slots: Iterable[int] | None = None) -> None:
        """Assert the class invariants; O(tree size + num_slots). For tests and debugging.

        With ``outside_slots`` (every slot held by requests), also assert that free, tree and
        outside slots partition ``[0, num_slots)``.
        """
        tree_slots: list[int] = []
        counts = {"evictable": 0, "locked": 0}
        leaves: set[RadixNode] = set()
        self._check_subtree(self._root, tree_slots, counts, leaves)
        assert leaves == self._evictable_leaves, "evictable-leaf set out of sync"
        assert counts["evictable"] == self._num_evictable, "evictable count out of sync"
        assert counts["locked"] == self._num_locked, "locked count out of sync"
        assert len(set(tree_slots)) == len(tree_slots), "a slot appears twice in the tree"
        for slot in tree_slots:
            assert not self._allocator.is_free(slot), f"tree slot {slot} is also free"
        if outside_slots is not None:
            held = list(outside_slots)
            owned = set(tree_slots).union(held)
            assert len(owned) == len(tree_slots) + len(held), "a slot is owned twice"
            assert all(not self._allocator.is_free(s) for s in held), "a held slot is free"
            total = len(owned) + self._allocator.num_free
            assert total == self._allocator.num_total, f"{total} slots accounted for"

    def _check_subtree(
        self, node: RadixNode, tree_slots: list[int], counts: dict[str, int], leaves: set[RadixNode]
    ) -> None:
        assert node.ref_count >= 0
        for first, child in node.children.items():
            assert child.parent is node and child.key and child.key[0] == first
            assert len(child.key) == len(child.slots)
            assert child.ref_count <= node.ref_count, "child locked more than its parent"
            tree_slots.extend(child.slots)
            counts["locked" if child.ref_count else "evictable"] += len(child.key)
            if not child.children and child.ref_count == 0:
                leaves.add(child)
            self._check_subtree(child, tree_slots, counts, leaves)

    def _split(self, child: RadixNode, m: int) -> RadixNode:
        """Cut ``child``'s edge after ``m`` tokens; return the new upper node.

        The upper node inherits ``ref_count``: every lock counted on ``child`` passes through
        it, so handles held by callers (``child`` itself) stay valid.
        """
        assert child.parent is not None and 0 < m < len(child.key)
        upper = RadixNode(
            child.key[:m], child.slots[:m], child.parent, next(self._ids), child.last_access
        )
        upper.ref_count = child.ref_count
        upper.children[child.key[m]] = child
        child.parent.children[child.key[0]] = upper
        child.key, child.slots, child.parent = child.key[m:], child.slots[m:], upper
        return upper

    def _add_leaf(self, parent: RadixNode, key: list[int], slots: list[int], now: int) -> None:
        leaf = RadixNode(key, slots, parent, next(self._ids), now)
        parent.children[key[0]] = leaf
        self._evictable_leaves.discard(parent)
        self._evictable_leaves.add(leaf)
        self._num_evictable += len(key)

    def _remove_leaf(self, leaf: RadixNode) -> RadixNode:
        """Detach an evictable leaf, free its slots, and return its former parent."""
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.ref_count == 0
        del parent.children[leaf.key[0]]
        leaf.parent = None
        self._evictable_leaves.discard(leaf)
        self._num_evictable -= len(leaf.key)
        self._allocator.free(leaf.slots)
        if parent is not self._root and not parent.children and parent.ref_count == 0:
            self._evictable_leaves.add(parent)
        return parent


def _common_len(key: list[int], token_ids: Sequence[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``token_ids[start:]``."""
    n = min(len(key), len(token_ids) - start)
    for i in range(n):
        if key[i] != token_ids[start + i]:
            return i
    return n
