"""Multi-step decoding under structured output: bursts decoded without the mask, kept up to the
first token the format refuses.

A constrained request's mask for each position depends on the tokens before it, which a
multi-step Forward draws on the device (target_service/multi_step.py), so a masked request would
decode one step a Forward. But a mask only removes tokens: where the model's own greedy token
is one the format allows, the masked draw is that very token. So a greedy constrained request
decodes K steps unmasked in one Forward (router/multi_step.py) and keeps its tokens up to the
first one its position's mask refuses (the mask itself: Constraint.allowed_prefix says why; an
EOS passes only where the format may end). What follows is dropped, and the next step is a
masked one from the last kept token, run again at its position (its KV written again, the same
values, into the slot it already holds). The output is the one masked step a Forward gives,
token for token (on the H200, bf16: 1.01x free target-only with ``json_object``, 0.82x with a
four-key schema, from 0.41x and 0.45x, measured before bursts checked masks rather than
llguidance's validate_tokens; docs/api.md).

A cut costs the burst's steps after it, so each request's bursts adapt: after a cut the next
burst is at most as long as the kept part (2 at least), and each burst kept whole doubles it
up to ``--decode-steps``. Sampled requests, and those asking for logprobs (their masked
distribution is what they would see), keep one masked step a Forward.
"""

from __future__ import annotations

from router.request import Request


class GrammarBursts:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.num_bursts = 0  # constrained requests' bursts a Forward ran
        self.num_cut = 0  # of those, bursts the format cut short

    def takes(self, req: Request) -> bool:
        """Whether the request's next decode step may be a burst: greedy, no logprobs, and
        not the masked step a cut owes."""
        o = req.options
        greedy = o.temperature == 0 and not o.logprobs
        return self.enabled and greedy and not req.masked_next

    def keep(self, req: Request, block: list[int]) -> list[int]:
        """The burst's tokens the format allows, in order up to the first it refuses; sets the
        request's next burst length, and whether its next step is masked."""
        allowed = req.constraint.allowed_prefix(block)
        self.num_bursts += 1
        if allowed < len(block):
            self.num_cut += 1
            req.masked_next = True
            req.burst_cap = max(2, allowed)
            return block[:allowed]
        req.burst_cap = 2 * len(block)
        return block

    def masked_step(self, req: Request) -> None:
        """A masked decode step ran: the next may be a burst again."""
        req.masked_next = False
