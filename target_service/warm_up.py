"""A throwaway request the target runs before it reports ready.

A service's first request pays for first use: on a GPU machine whose Triton cache is empty,
compiling the kernels of the eager prefill (the decode and verify graphs compile theirs at
capture); on a CPU, the allocator's and the math libraries' first calls. Run here, that cost
goes to start-up, before the health check says SERVING, instead of to a user's first TTFT.
The request uses the pool's first slots and is released: the router assigns slots only to
requests it sends later, and each request writes a slot before it reads it.
"""

from __future__ import annotations

import logging
import time

from target_service.admission import StepItem, VerifyItem
from target_service.engine import TargetEngine
from target_service.request_table import SamplingSpec

log = logging.getLogger("splitspec.target")

WARM_UP_ID = "splitspec-warm-up"
GREEDY = SamplingSpec(temperature=0.0, top_p=1.0, top_k=0, seed=0)
# Two prompt lengths: Triton compiles a variant for sizes divisible by 16 and one for others.
PROMPT_LENGTHS = (23, 32)
CHAIN = 4  # nodes of the verified chain


def warm_up(engine: TargetEngine) -> float:
    """A prefill, a decode Forward and a verify of a scratch request per prompt length;
    returns the seconds."""
    started = time.perf_counter()
    ran = [length for length in PROMPT_LENGTHS if _one_request(engine, length)]
    seconds = time.perf_counter() - started
    if ran:
        log.info("warmed up in %.2f s (scratch requests of %s prompt tokens: prefill, decode, "
                 "verify)", seconds, " and ".join(map(str, ran)))  # fmt: skip
    else:
        log.info("no warm-up: its scratch request does not fit the KV pool, the context or the "
                 "step limits (--num-slots, --max-batch-tokens, --max-tree-tokens)")  # fmt: skip
    return seconds


def _fits(engine: TargetEngine, length: int) -> bool:
    """Whether the scratch request fits: tests' tiny pools, or a user's small step limits,
    skip it rather than fail the start."""
    config = engine.config
    needed = length + config.max_decode_steps + CHAIN
    if needed > min(engine.max_context, config.num_slots):
        return False
    return length <= config.max_batch_tokens and CHAIN <= config.max_tree_tokens


def _one_request(engine: TargetEngine, length: int) -> bool:
    """Whether it ran (only where it fits)."""
    if not _fits(engine, length):
        return False
    steps = engine.config.max_decode_steps
    prompt = [_token(engine, i) for i in range(length)]
    try:
        first = engine.forward([StepItem(WARM_UP_ID, prompt, 0, list(range(length)), True,
                                         GREEDY)])  # fmt: skip
        position = length
        decode = StepItem(WARM_UP_ID, first.next_token_ids, position,
                          list(range(position, position + steps)))  # fmt: skip
        ids = engine.forward([decode], steps).next_token_ids
        position += steps
        chain = [ids[-1], *(_token(engine, length + i) for i in range(CHAIN - 1))]
        tree = VerifyItem(WARM_UP_ID, position, chain, list(range(-1, CHAIN - 1)),
                          list(range(position, position + CHAIN)), return_hidden=True)  # fmt: skip
        engine.verify([tree])
        engine.read_hidden(WARM_UP_ID, 0, length)  # the drafter's first rows come this way
    finally:
        engine.release([WARM_UP_ID])
    return True


def _token(engine: TargetEngine, i: int) -> int:
    """Ordinary ids from the middle of the vocabulary, not specials."""
    vocab = engine.model_config.vocab_size
    return (vocab // 3 + 7 * i) % vocab
