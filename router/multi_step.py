"""Multi-step decoding, the router's side: K target-only decode steps in one Forward.

Each decode step through the whole stack costs the target's step plus the router's and the
RPC's own work, which on a GPU rivals the step itself. When a step is decode-only and
target-only, the router asks the target for K steps at once (target_service/multi_step.py)
and gets K tokens per request back: the per-step overhead is paid once per K tokens.

K is one number for the whole batch: the router's ``--decode-steps`` capped by the target's
advertised ``max_decode_steps``, by every request's remaining ``max_new_tokens`` (so no
request overshoots its length) and its room in the context. K is 1 (an ordinary step) when:

* a draft tree is verified this step, a prompt is prefilling (this step or waiting for room
  in it), so a new arrival waits at most one multi-step Forward for its prefill;
* a request has presence or frequency penalties (the target records their counts per step),
  a logit_bias, a repetition_penalty, or min_tokens while it still bans its ids (the target's
  multi-step graphs change no logits), or structured output but for a greedy request's
  unmasked bursts (router/grammar_bursts.py: each step's allowed tokens depend on the last,
  so a burst is kept up to the first token the format refuses, and K is at most the
  request's burst length);
* under ``--kv-policy retract``, the K slots per request are not free.

The K tokens of a request go through the stop rules one by one (router/output.py): the first
EOS, stop token, stop string or length ends it, what follows is dropped, and finishing the
request caches only KV of kept tokens and frees every other slot (router/kv_manager.py).
Streams get each burst of up to K tokens as one item.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protos import target_pb2
from router.forward_item import forward_item
from router.grammar_bursts import GrammarBursts
from router.kv_manager import KVManager, recomputable
from router.request import Request

if TYPE_CHECKING:
    from router.scheduler import Planned, Scheduler


def capped_steps(router_setting: int, info: target_pb2.TargetInfo) -> int:
    """K's cap: the router's ``--decode-steps`` (0: any) capped by the target's."""
    advertised = max(1, info.max_decode_steps)  # 0: a target from before multi-step decoding
    return min(router_setting or advertised, advertised)


class MultiStep:
    def __init__(self, max_steps: int, grammar_bursts: bool = True) -> None:
        self.max_steps = max(1, max_steps)
        self.num_forwards = 0  # Forwards that ran more than one step
        self.bursts = GrammarBursts(grammar_bursts)

    def steps_for(self, scheduler: Scheduler, plan: list[Planned], trees: dict) -> int:
        """Decode steps for this step's target-only Forward (1: an ordinary step)."""
        if self.max_steps <= 1 or trees or not plan:
            return 1
        if any(r.is_prefilling for r in scheduler.running):
            return 1
        reqs = [p.req for p in plan]
        if not all(recomputable(r) and not self.changes_logits(r) for r in reqs):
            return 1  # penalties, logit_bias, a binding min_tokens, a mask: one step
        max_context = scheduler.spec.max_context
        steps = min(
            self.max_steps,
            *(r.options.max_new_tokens - len(r.output_ids) for r in reqs),
            *(max_context - r.num_computed for r in reqs),
            *(r.burst_cap for r in reqs if r.constraint is not None and r.burst_cap),
        )
        if steps > 1 and _short_of_slots(scheduler.kv, reqs, steps):
            return 1
        self.num_forwards += steps > 1
        return max(1, steps)


    def changes_logits(self, req: Request) -> bool:
        """Whether the request's next draw needs its logits changed on the host (a bias, a
        penalty, a binding min_tokens, a mask outside a burst): then one decode step."""
        o = req.options
        masked = req.constraint is not None and not self.bursts.takes(req)
        return bool(o.logit_bias) or o.repetition_penalty != 1.0 or req.min_tokens_binds or masked


def _short_of_slots(kv: KVManager, reqs: list[Request], steps: int) -> bool:
    """Whether K positions per request need more slots than can be had without retracting."""
    extra = sum(kv.extra_needed(r, r.num_computed + steps) for r in reqs)
    return extra > kv.available


def decode_item(kv: KVManager, p: Planned, steps: int) -> target_pb2.ForwardItem:
    """The request's ForwardItem; for K > 1 steps its slots cover the K positions it runs,
    and a constrained request's burst goes unmasked."""
    if steps > 1:
        kv.ensure_slots(p.req, p.req.num_computed + steps)
    return forward_item(kv, p.req, p.num_tokens, p.sample, masked=steps == 1)
