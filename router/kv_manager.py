"""Admission budget and slot reservation over the radix cache.

Every running request holds a *claim*: the slots it may still allocate before it finishes.
Admission keeps ``free + evictable >= sum(claims)``, so a running request never fails to get
a slot mid-generation and never needs to be preempted.
"""

from __future__ import annotations

from router.radix_cache import RadixCache
from router.request import Request


class KVManager:
    def __init__(self, cache: RadixCache, reserve_block: int, lookahead: int = 0) -> None:
        self.cache = cache
        self.reserve_block = reserve_block
        self.lookahead = lookahead  # extra slots per request for a draft tree's tail
        self.outstanding = 0  # sum of the claims of admitted requests

    @property
    def num_total(self) -> int:
        return self.cache.allocator.num_total

    @property
    def num_free(self) -> int:
        return self.cache.allocator.num_free

    def slots_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens - 1 + self.lookahead

    def try_admit(self, req: Request) -> bool:
        """Pins the longest cached prefix and reserves the rest, or changes nothing."""
        # Keep one prompt token uncached: its forward produces the first sampled token.
        match = self.cache.match_prefix(req.prompt_ids[:-1])
        self.cache.lock(match.node)
        claim = self.slots_needed(req.prompt_len, req.options.max_new_tokens) - match.length
        available = self.num_free + self.cache.num_evictable_tokens - self.outstanding
        if claim > available:
            self.cache.unlock(match.node)
            return False
        req.match_node, req.cached_len = match.node, match.length
        req.slots, req.num_computed = list(match.slots), match.length
        req.claim = claim
        self.outstanding += claim
        return True

    def ensure_slots(self, req: Request, num_positions: int) -> None:
        """Makes ``req.slots`` cover positions < num_positions, allocating ahead in blocks."""
        need = num_positions - len(req.slots)
        if need <= 0:
            return
        count = min(max(need, self.reserve_block), req.claim)
        req.slots += self.cache.allocate(count)
        req.claim -= count
        self.outstanding -= count

    def finish(self, req: Request, cache: bool = True) -> None:
        """Caches the computed context, frees the unused reservation, unpins the prefix.

        With ``cache=False`` (the target failed) only the matched prefix stays cached.
        """
        if req.match_node is None:
            return  # never admitted
        # A stop inside an accepted block leaves computed KV past the kept tokens: not cached.
        keep = min(req.num_computed, len(req.context_ids)) if cache else req.cached_len
        self.cache.insert(req.context_ids[:keep], req.slots[:keep])
        self.cache.allocator.free(req.slots[keep:])
        self.cache.unlock(req.match_node)
        self.outstanding -= req.claim
        req.slots, req.claim, req.match_node = [], 0, None
