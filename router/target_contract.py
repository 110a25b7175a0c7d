"""What the router took from the target's TargetInfo at start, checked again when a lost target
comes back (router/target_watch.py).

A target restarted with other settings must not be served as if it were the old one: a smaller
pool would get slots past its end, a lower ``--decode-steps`` would refuse every multi-step
Forward, another model would get the old tokenizer's ids. So, when it answers again:

* what the router can follow, it follows: the pool size (the KV bookkeeping starts afresh
  anyway) and the multi-step cap;
* what it built its limits on at start (the model, its vocabulary and hidden size, the dtype of
  the hidden rows it carries to drafters, the context and batch limits it cut requests to) must
  still hold; where one does not, the router stays NOT_SERVING and refuses requests
  UNAVAILABLE with the reason, since only a router restart can take the new target on.
"""

from __future__ import annotations

from collections.abc import Callable

from protos import target_pb2
from router.kv_manager import KVManager
from router.multi_step import MultiStep, capped_steps

# Fields the router's tokenizer, limits and hidden-row handling were built on.
SAME = ("model_name", "architecture", "vocab_size", "hidden_size", "dtype")


class TargetContract:
    def __init__(
        self,
        info: target_pb2.TargetInfo,
        max_step_tokens: int,
        max_tree_tokens: int,
        router_decode_steps: int,
        fresh_kv: Callable[[int], KVManager],
    ) -> None:
        """``router_decode_steps``: the router's own ``--decode-steps`` (0: the target's);
        ``fresh_kv(num_slots)``: new KV bookkeeping for a pool of that size."""
        self.info = info  # as at start: the router's limits stay those it was built with
        self.max_step_tokens, self.max_tree_tokens = max_step_tokens, max_tree_tokens
        self.router_decode_steps = router_decode_steps
        self.fresh_kv = fresh_kv

    def problem(self, now: target_pb2.TargetInfo) -> str | None:
        """Why the router cannot serve this target without a restart (None: it can)."""
        for name in SAME:
            before, after = getattr(self.info, name), getattr(now, name)
            if before != after:
                return f"its {name} was {before!r} and is now {after!r}"
        limits = [
            ("max_context_length", self.info.max_context_length, now.max_context_length),
            ("max_batch_tokens", self.max_step_tokens, now.max_batch_tokens),
        ]
        if now.max_tree_tokens:  # 0: no limit advertised
            limits.append(("max_tree_tokens", self.max_tree_tokens, now.max_tree_tokens))
        for name, used, after in limits:
            if after < used:
                return f"its {name} is now {after}, below the {used} the router cuts requests to"
        return None

    def adopt(self, now: target_pb2.TargetInfo, multi_step: MultiStep) -> KVManager:
        """Follows the target's pool size and multi-step cap; returns the fresh KV bookkeeping."""
        multi_step.max_steps = capped_steps(self.router_decode_steps, now)
        return self.fresh_kv(now.num_slots)
