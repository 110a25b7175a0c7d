"""Continuous batching changes nothing: 16 concurrent requests of mixed prompt lengths (four
above --max-step-tokens 512, so they prefill in chunks alongside others' decode steps) and mixed
max_new_tokens give the greedy output each gives alone, and every stream is well-formed."""

from __future__ import annotations

import time

import pytest

from tests.helpers.checks import assert_well_formed
from tests.helpers.prompts import pick_prompts, router_tokenizer
from tests.helpers.reference import HFReference, TieCase, assert_same_greedy
from tests.helpers.rpc import Router, assert_slots_accounted, greedy

pytestmark = pytest.mark.slow

MAX_STEP_TOKENS = 512  # the router's default
LENGTHS = [
    (15, 40),
    (530, 600),
    (40, 80),
    (80, 120),
    (120, 200),
    (600, 700),
    (200, 260),
    (260, 330),
    (20, 60),
    (700, 800),
    (60, 100),
    (100, 150),
    (513, 560),
    (150, 200),
    (330, 400),
    (400, 480),
]
# Mixed, so requests leave the batch at different steps; the longest outlast the ~10 steps the
# prompts take to prefill (512 tokens a step), so decodes run beside every chunk.
MAX_NEW = [2, 6, 12, 20, 4, 16, 8, 24] * 2


def test_concurrent_outputs_equal_outputs_alone(
    router: Router, hf: HFReference, tie_cases: list[TieCase]
) -> None:
    prompts = [p.ids for p in pick_prompts(LENGTHS, start=1000)]
    requests = [greedy(ids, n) for ids, n in zip(prompts, MAX_NEW, strict=True)]
    assert router.wait_idle().num_running == 0

    # Concurrently first, while the prompts are not cached: the long ones must be chunked.
    started = time.perf_counter()
    together, max_running = router.generate_many_observed(requests)
    print(
        f"{len(requests)} concurrent requests: {time.perf_counter() - started:.1f} s, "
        f"at most {max_running} running at once"
    )
    # Alone afterwards: each prompt is then cached (all but its last token), and decodes alone.
    started = time.perf_counter()
    alone = router.generate_each(requests)
    print(f"the same one at a time: {time.perf_counter() - started:.1f} s")

    assert max_running >= len(requests) // 2, "the requests did not run as one batch"
    for ids, stream in zip(prompts, together, strict=True):
        if len(ids) > MAX_STEP_TOKENS:
            uncached = len(ids) - stream.final.usage.cached_tokens
            assert uncached > MAX_STEP_TOKENS, "a long prompt was cached: no chunked prefill"
    failures = []
    for n, (ids, max_new) in enumerate(zip(prompts, MAX_NEW, strict=True)):
        for stream in (together[n], alone[n]):
            assert_well_formed(stream, len(ids), max_new, router_tokenizer())
        try:
            assert_same_greedy(
                f"batching prompt {n} ({len(ids)} tokens, max_new_tokens {max_new})",
                together[n].token_ids,
                alone[n].token_ids,
                hf.gap_after(ids, alone[n].token_ids),
                tie_cases,
            )
        except AssertionError as err:
            failures.append(str(err))
    assert not failures, "\n".join(failures)
    assert_slots_accounted(router.wait_idle())
