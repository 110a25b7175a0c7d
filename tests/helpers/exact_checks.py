"""The --exact check shared by tests/test_exact_cpu.py and tests/test_exact_gpu.py: the hidden
rows of a greedy continuation, computed by one-token decodes, by one verify of the chain and by
one prefill chunk beside another request, equal bit for bit."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.request_table import SamplingSpec

GREEDY = SamplingSpec(0.0, 1.0, 0, 0)


def assert_step_kinds_agree(
    make_engine: Callable[[], TargetEngine],
    prompt: list[int],
    other: list[int],
    steps: int,
    num_slots: int,
) -> None:
    n = len(prompt)
    slots = iter(random.Random(0).sample(range(num_slots), num_slots))  # a scattered layout

    decoded = make_engine()
    prefill = StepItem("a", prompt, 0, [next(slots) for _ in prompt], True, GREEDY)
    tokens = decoded.forward([prefill]).next_token_ids
    for i in range(steps + 1):  # the chain's bonus token too
        step = StepItem("a", [tokens[-1]], n + i, [next(slots)])
        tokens += decoded.forward([step]).next_token_ids
    by_decode = decoded.read_hidden("a", n, n + steps)

    verified = make_engine()
    verified.forward([StepItem("a", prompt, 0, [next(slots) for _ in prompt], True, GREEDY)])
    chain = tokens[: steps + 1]  # the root (first sampled token) and `steps` drafts
    (result,), *_ = verified.verify(
        [VerifyItem("a", n, chain, [-1, *range(steps)], [next(slots) for _ in chain], True)]
    )
    assert result.token_ids == tokens[1 : steps + 2], "the greedy chain was not all accepted"
    assert result.hidden is not None
    assert torch.equal(result.hidden[:steps], by_decode), "verify and decode round differently"

    chunked = make_engine()
    text = prompt + tokens[:steps]
    both = [StepItem("b", other, 0, [next(slots) for _ in other], True, GREEDY),
            StepItem("a", text, 0, [next(slots) for _ in text], True, GREEDY)]  # fmt: skip
    assert chunked.forward(both).next_token_ids[1] == tokens[steps]
    assert torch.equal(chunked.read_hidden("a", n, n + steps), by_decode), "prefill differs"
