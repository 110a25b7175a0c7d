"""Admission budget and slot reservation over the radix cache.

Every running request holds a *claim*: the slots it may still allocate that admission set
aside for it. Admission keeps ``free + evictable >= sum(claims)``.

Two policies (``--kv-policy``):
  * ``reserve``: the claim is everything the request may ever need (prompt, max_new_tokens,
    a draft tree's tail), so a running request never runs short and is never retracted;
    requests wait in the queue instead.
  * ``retract``: the claim is the prefill only, plus a watermark of ``reserve_block`` slots
    per running request left free; decoding allocates beyond it as it goes, and when a step
    cannot get its slots the scheduler retracts running requests (router/retraction.py).
    A request whose output cannot be recomputed exactly (penalties count its completion on
    the target, a state a recompute would lose) still gets the whole reservation.
"""

from __future__ import annotations

from router.radix_cache import RadixCache
from router.request import Request


def recomputable(req: Request) -> bool:
    o = req.options
    return o.presence_penalty == 0 and o.frequency_penalty == 0


class KVManager:
    def __init__(
        self, cache: RadixCache, reserve_block: int, lookahead: int = 0, retract: bool = False
    ) -> None:
        self.cache = cache
        self.reserve_block = reserve_block
        self.lookahead = lookahead  # extra slots per request for a draft tree's tail
        self.retract = retract
        self.outstanding = 0  # sum of the claims of admitted requests
        self.num_retractable = 0  # admitted requests that may be retracted

    @property
    def num_total(self) -> int:
        return self.cache.allocator.num_total

    @property
    def num_free(self) -> int:
        return self.cache.allocator.num_free

    @property
    def available(self) -> int:
        """Slots that can be allocated now without eating into anyone's claim."""
        return self.num_free + self.cache.num_evictable_tokens - self.outstanding

    def slots_needed(self, prompt_len: int, max_new_tokens: int) -> int:
        return prompt_len + max_new_tokens - 1 + self.lookahead

    def try_admit(self, req: Request) -> bool:
        """Pins the longest cached prefix and reserves the rest, or changes nothing."""
        # Keep one context token uncached: its forward produces the next sampled token. A
        # prompt to score is computed in full: the cache holds KV, not the rows' scores.
        match = self.cache.match_prefix([] if req.scores_missing else req.context_ids[:-1])
        self.cache.lock(match.node)
        reserved = not (self.retract and recomputable(req))
        if reserved:
            claim = self.slots_needed(req.prompt_len, req.options.max_new_tokens) - match.length
            margin = 0
        else:
            claim = len(req.context_ids) - match.length
            margin = self.reserve_block * (self.num_retractable + 1)  # room to grow
        if claim + margin > self.available:
            self.cache.unlock(match.node)
            return False
        req.match_node, req.cached_len = match.node, match.length
        req.slots, req.num_computed = list(match.slots), match.length
        req.claim, req.reserved = claim, reserved
        if req.cached_at_admission is None:
            req.cached_at_admission = match.length
        self.outstanding += claim
        self.num_retractable += not reserved
        return True

    def extra_needed(self, req: Request, num_positions: int) -> int:
        """Slots beyond its claim that covering num_positions would take from ``available``."""
        if req.reserved:
            return 0
        return max(0, num_positions - len(req.slots) - req.claim)

    def ensure_slots(self, req: Request, num_positions: int) -> None:
        """Makes ``req.slots`` cover positions < num_positions (reserved requests allocate
        ahead in blocks; retractable ones exactly, so that no slot idles under pressure)."""
        need = num_positions - len(req.slots)
        if need <= 0:
            return
        count = min(max(need, self.reserve_block), req.claim) if req.reserved else need
        from_claim = min(count, req.claim)
        req.slots += self.cache.allocate(count)
        req.claim -= from_claim
        self.outstanding -= from_claim

    def trim(self, req: Request, keep: int) -> int:
        """Frees a retractable request's slots past position ``keep`` (a draft tree's tail);
        returns how many. The target's table of the request must then be rebuilt."""
        if req.reserved or len(req.slots) <= keep:
            return 0
        spare = req.slots[keep:]
        del req.slots[keep:]
        self.cache.allocator.free(spare)
        return len(spare)

    def finish(self, req: Request, cache: bool = True) -> None:
        """Caches the computed context, frees the unused reservation, unpins the prefix.

        With ``cache=False`` (the target failed) only the matched prefix stays cached.
        """
        if req.match_node is None:
            return  # never admitted, or retracted and waiting
        # A stop inside an accepted block leaves computed KV past the kept tokens: not cached.
        keep = min(req.num_computed, len(req.context_ids)) if cache else req.cached_len
        self.cache.insert(req.context_ids[:keep], req.slots[:keep])
        self.cache.allocator.free(req.slots[keep:])
        self.cache.unlock(req.match_node)
        self.outstanding -= req.claim
        self.num_retractable -= not req.reserved
        req.slots, req.claim, req.match_node = [], 0, None
