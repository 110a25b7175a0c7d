"""Greedy output through router + target equals HF transformers' generate, token for token.

Same GGUF, fp32, CPU. Six chat-templated ShareGPT prompts of 20 to 900 tokens (the longest are
prefilled in chunks by the router) run concurrently through the stack and one by one in HF.
"""

from __future__ import annotations

import time

import pytest

from protos import generation_pb2 as pb
from tests.helpers.checks import assert_well_formed
from tests.helpers.prompts import pick_prompts, router_tokenizer
from tests.helpers.reference import EOS_ID, HFReference, TieCase, assert_same_greedy
from tests.helpers.rpc import Router, greedy

pytestmark = pytest.mark.slow

MAX_NEW = 24  # past a reservation block (16 slots) of decode after every prefill, chunked or not
# Short to long: both prompts above the router's --max-step-tokens (512) prefill in chunks.
LENGTHS = [
    (20, 40),
    (70, 110),
    (160, 220),
    (300, 400),
    (520, 700),
    (700, 900),
]


def test_greedy_equals_hf_generate(
    router: Router, hf: HFReference, tie_cases: list[TieCase]
) -> None:
    prompts = [p.ids for p in pick_prompts(LENGTHS, start=0)]
    started = time.perf_counter()
    streams = router.generate_many([greedy(ids, MAX_NEW) for ids in prompts])
    print(f"stack: {len(prompts)} concurrent requests in {time.perf_counter() - started:.1f} s")
    failures = []
    for n, (ids, stream) in enumerate(zip(prompts, streams, strict=True)):
        assert_well_formed(stream, len(ids), MAX_NEW, router_tokenizer())
        ours = stream.token_ids
        expected_reason = pb.FINISH_REASON_EOS if ours[-1] == EOS_ID else pb.FINISH_REASON_LENGTH
        assert stream.final.finish_reason == expected_reason
        reference = hf.generate(ids, MAX_NEW)
        try:
            assert_same_greedy(
                f"hf-equality prompt {n} ({len(ids)} tokens)",
                ours,
                reference.token_ids,
                reference.gaps.__getitem__,
                tie_cases,
            )
        except AssertionError as err:
            failures.append(str(err))
    print(f"HF: {len(prompts)} generations, {time.perf_counter() - started:.1f} s in all")
    assert not failures, "\n".join(failures)


def test_tie_rule_allows_only_near_ties() -> None:
    ties: list[TieCase] = []
    gaps = {2: 5e-3, 3: 0.5}.__getitem__
    assert_same_greedy("synthetic equal", [5, 6, 7], [5, 6, 7], gaps, ties)
    assert_same_greedy("synthetic near tie", [5, 6, 8], [5, 6, 9], gaps, ties)
    assert [(t.position, t.ours, t.reference) for t in ties] == [(2, 8, 9)]
    with pytest.raises(AssertionError, match="not a tie"):
        assert_same_greedy("clear winner", [5, 6, 7, 1], [5, 6, 7, 2], gaps, ties)
    with pytest.raises(AssertionError, match="not a tie"):
        assert_same_greedy("stopped early", [5, 6, 7], [5, 6, 7, EOS_ID], gaps, ties)
    assert len(ties) == 1
