"""A request's state inside the router, from admission to its last stream item."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

# W3C Trace Context's headers, carried from a client's gRPC metadata or HTTP request.
TRACE_HEADERS = ("traceparent", "tracestate")


@dataclass(frozen=True)
class SamplingOptions:
    """Validated sampling and stopping parameters (defaults already applied)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False  # stream each token's log-probability (router/logprobs.py)
    top_logprobs: int = 0
    prompt_logprobs: bool = False  # score the prompt (router/prompt_scores.py)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), added before sampling
    min_p: float = 0.0  # vLLM's, in [0, 1]; 0: off
    repetition_penalty: float = 1.0  # HF/vLLM's, over prompt and completion; 1: off
    min_tokens: int = 0  # no EOS, stop token or stop string before this many tokens
    # What the target refuses until min_tokens: EOS (unless ignore_eos) and stop_token_ids
    min_tokens_banned_ids: tuple[int, ...] = ()


@dataclass(eq=False)
class Request:
    """Router-side state. Only the scheduler's task mutates it (single asyncio thread).

    KV bookkeeping: ``slots[i]`` is the target slot of context position i. The first
    ``cached_len`` come from the radix cache (pinned by ``match_node``); the rest were
    allocated for this request. The target has computed KV for positions < ``num_computed``
    and knows the slots < ``num_sent_slots``.
    """

    request_id: str
    prompt_ids: list[int]
    options: SamplingOptions
    speculate: bool | None = None
    # The client's W3C trace context (its traceparent and tracestate headers), which the
    # request's span continues (router/request_spans.py); empty: the trace starts here.
    trace_context: dict[str, str] = field(default_factory=dict)
    arrival: float = field(default_factory=time.perf_counter)
    match_node: Any = None
    cached_len: int = 0
    slots: list[int] = field(default_factory=list)
    num_sent_slots: int = 0
    num_computed: int = 0
    claim: int = 0  # slots this request may still allocate; reserved in the admission budget
    # False: admitted on its prefill alone under --kv-policy retract, so it may be retracted
    # (router/retraction.py); True: its whole claim was reserved and it never is.
    reserved: bool = True
    recompute_len: int = 0  # context length to prefill again after its last retraction
    num_retractions: int = 0
    cached_at_admission: int | None = None  # prompt tokens the cache served, for usage
    output_ids: list[int] = field(default_factory=list)
    first_scheduled: float | None = None
    first_token: float | None = None
    # Speculation (see router/speculation.py): the replica this request sticks to, whether it
    # holds the context up to the last committed token, and what to append on the next round.
    replica: Any = None
    draft_synced: bool = False
    pending_update: Any = None
    # Position of the root of the last update its drafter took (it holds tokens 0..draft_end);
    # -1: not known, so a catch-up ingests the whole context (router/catch_up.py).
    draft_end: int = -1
    round: int = 0
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    forced_drafts: bool = True  # structured output's forced tokens grow its draft trees
    forced_tokens: int = 0  # draft tokens the format forced (router/grammar_tree.py)
    # The prompt's scores (SamplingParams.prompt_logprobs): entries for positions 1.. in order,
    # sent with the first stream item.
    prompt_scores: list = field(default_factory=list)
    # Structured output's grammar state (router/structured_output.py); None: unconstrained.
    constraint: Any = None
    # Its multi-step bursts decoded without the mask (router/grammar_bursts.py): the most steps
    # the next may run (0: --decode-steps), and whether a cut owes a masked step first.
    burst_cap: int = 0
    masked_next: bool = False
    abort_requested: bool = False
    finished: bool = False
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)

    @property
    def min_tokens_binds(self) -> bool:
        """Whether the target still refuses the min_tokens ids (then one decode step a
        Forward, its logits changed before the draw)."""
        o = self.options
        return len(self.output_ids) < o.min_tokens and bool(o.min_tokens_banned_ids)

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefill_len(self) -> int:
        """Positions to run before decoding: the prompt, or after a retraction the whole
        context it had (its last chunk samples the next token, as a decode step would)."""
        return max(self.prompt_len, self.recompute_len)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.prefill_len

    @property
    def scores_missing(self) -> bool:
        """It asked for prompt log-probabilities and some are not in yet."""
        return self.options.prompt_logprobs and len(self.prompt_scores) < self.prompt_len - 1

    @property
    def prompt_cached_len(self) -> int:
        """Prompt tokens served from the cache at first admission (a recompute after a
        retraction finds its own tokens there: they are not the client's cache hits)."""
        return self.cached_len if self.cached_at_admission is None else self.cached_at_admission

    @property
    def max_context_needed(self) -> int:
        """Positions that may ever need KV: the last sampled token never does."""
        return self.prompt_len + self.options.max_new_tokens - 1
