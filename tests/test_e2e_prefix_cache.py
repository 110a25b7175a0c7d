"""The radix cache: a shared prefix is served from cache with the output a cold cache gives, and
a KV pool far smaller than the traffic evicts without changing any output or leaking a slot."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from splitspec.launcher import LocalStack
from tests.conftest import StackLauncher
from tests.helpers.checks import assert_well_formed
from tests.helpers.prompts import chat_ids, pick_prompts, router_tokenizer
from tests.helpers.reference import HFReference, TieCase, assert_same_greedy, first_difference
from tests.helpers.rpc import Router, Stream, assert_slots_accounted, greedy

pytestmark = pytest.mark.slow

SMALL_POOL = 600  # KV slots of the module's own target
MIN_SHARED = 200
MAX_NEW = 16  # per greedy run (four, at batch 1), warm and cold compared token for token
NUM_UNIQUE, NUM_SHARING = 12, 8
NUM_FLUSH, FLUSH_MAX_NEW = 3, 8


@pytest.fixture(scope="module")
def small(stack_launcher: StackLauncher) -> Iterator[Router]:
    """A fresh stack with a tiny KV pool; its cache is cold when the module starts."""
    stack: LocalStack = stack_launcher.start("small-pool", ["--num-slots", str(SMALL_POOL)])
    client = Router(stack.router_address)
    try:
        yield client
    finally:
        client.close()
        stack_launcher.stop(stack)


def system_chat(system: str, user: str) -> tuple[int, ...]:
    return chat_ids([{"role": "system", "content": system}, {"role": "user", "content": user}])


def turn_with_length(lo: int, hi: int, start: int) -> str:
    (prompt,) = pick_prompts([(lo, hi)], start)
    return prompt.text


def test_shared_prefix_is_served_from_cache_with_cold_output(
    router: Router, small: Router, hf: HFReference, tie_cases: list[TieCase]
) -> None:
    system = turn_with_length(260, 400, start=2000)
    x = system_chat(system, turn_with_length(15, 40, start=2100))
    y = system_chat(system, turn_with_length(15, 40, start=2200))
    shared = first_difference(x, y)
    assert shared is not None and shared >= MIN_SHARED

    # Cold references: x on the fresh stack, y on the shared one before x was ever sent there.
    x_cold = small.generate(greedy(x, MAX_NEW))
    y_cold = router.generate(greedy(y, MAX_NEW))
    for prompt, cold in ((x, x_cold), (y, y_cold)):
        assert cold.final.usage.cached_tokens < 10  # at most the template's first tokens
        assert_well_formed(cold, len(prompt), MAX_NEW, router_tokenizer())

    x_warm = router.generate(greedy(x, MAX_NEW))
    assert x_warm.final.usage.cached_tokens == shared  # y's prefix, up to where they differ
    assert_well_formed(x_warm, len(x), MAX_NEW, router_tokenizer())
    assert_same_greedy(
        "prefix cache: x after y",
        x_warm.token_ids,
        x_cold.token_ids,
        hf.gap_after(x, x_cold.token_ids),
        tie_cases,
    )

    y_warm = router.generate(greedy(y, MAX_NEW))
    assert y_warm.final.usage.cached_tokens == len(y) - 1  # all but the token that samples
    assert_same_greedy(
        "prefix cache: y again",
        y_warm.token_ids,
        y_cold.token_ids,
        hf.gap_after(y, y_cold.token_ids),
        tie_cases,
    )
    assert_slots_accounted(router.wait_idle())


def eviction_prompts() -> tuple[list[tuple[int, ...]], list[int]]:
    """12 distinct chats and 8 that share a ~150-token system prompt, 150 to 300 tokens each
    (most near 150: prefill dominates the run time); also the indices of the sharing ones."""
    lengths = [(150, 190)] * (NUM_UNIQUE - 3) + [(190, 240), (240, 270), (270, 300)]
    unique = [p.ids for p in pick_prompts(lengths, start=3000)]
    system = turn_with_length(150, 180, start=3500)
    sharing = [
        p.ids
        for p in pick_prompts(
            [(150, 200)] * NUM_SHARING, start=3600, template=lambda text: system_chat(system, text)
        )
    ]
    half = NUM_SHARING // 2
    prompts = unique[:4] + sharing[:half] + unique[4:] + sharing[half:]
    return prompts, [prompts.index(p) for p in sharing]


def test_eviction_keeps_outputs_and_slots(
    router: Router, small: Router, hf: HFReference, tie_cases: list[TieCase]
) -> None:
    prompts, sharing = eviction_prompts()
    shared_len = first_difference(prompts[sharing[0]], prompts[sharing[1]])
    assert shared_len is not None and shared_len > 100
    max_new = [4, 8] * (len(prompts) // 2)
    # Sent later, one at a time: together they need more than the pool, which evicts every
    # older leaf (LRU) before any of theirs.
    flush = [p.ids for p in pick_prompts([(250, 300)] * NUM_FLUSH, start=3800)]
    assert sum(len(ids) + FLUSH_MAX_NEW for ids in flush) > SMALL_POOL
    prompts += flush
    max_new += [FLUSH_MAX_NEW] * NUM_FLUSH
    requests = [greedy(ids, n) for ids, n in zip(prompts, max_new, strict=True)]
    batch = requests[:-NUM_FLUSH]
    assert sum(len(r.input_ids.ids) + r.sampling.max_new_tokens for r in batch) > 5 * SMALL_POOL

    def check(n: int, out: Stream, what: str) -> None:
        assert_well_formed(out, len(prompts[n]), max_new[n], router_tokenizer())
        assert_same_greedy(
            f"eviction: {what} prompt {n} ({len(prompts[n])} tokens)",
            out.token_ids,
            references[n].token_ids,
            hf.gap_after(prompts[n], references[n].token_ids),
            tie_cases,
        )

    references = router.generate_many(requests)  # 32768 slots: nothing is evicted there
    outputs = small.generate_many(batch)  # admitted a few at a time, evicting as they go
    failures = []
    for n, out in enumerate(outputs):
        try:
            check(n, out, "concurrent")
        except AssertionError as err:
            failures.append(str(err))
    assert not failures, "\n".join(failures)
    status = small.wait_idle()
    assert status.num_total_slots == SMALL_POOL
    assert_slots_accounted(status)

    # One at a time, so that what is cached is known: a shared prefix is reused, then evicted
    # and recomputed, with the same output each time.
    first, second = sharing[0], sharing[1]
    check(first, small.generate(requests[first]), "sequential")
    hit = small.generate(requests[second])
    assert hit.final.usage.cached_tokens >= shared_len
    check(second, hit, "prefix hit")
    for n in range(len(batch), len(requests)):
        check(n, small.generate(requests[n]), "flush")
    evicted = small.generate(requests[second])
    assert evicted.final.usage.cached_tokens < shared_len
    check(second, evicted, "after eviction")
    assert_slots_accounted(small.wait_idle())


def test_request_larger_than_the_pool_is_rejected(small: Router) -> None:
    (prompt,) = pick_prompts([(400, 500)], start=3900)
    with pytest.raises(grpc.RpcError) as err:
        small.generate(greedy(prompt.ids, SMALL_POOL))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "KV slots" in err.value.details() and str(SMALL_POOL) in err.value.details()
    assert small.generate(greedy(prompt.ids, 4)).final.usage.completion_tokens >= 1
