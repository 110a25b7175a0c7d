"""The whole stack with the target in --exact mode: greedy speculation gives target-only's output
token for token, no tie allowance, with batches that differ between the two runs.

Real processes and gRPC: the default model (CPU, fp32, --exact) and one EAGLE replica with the
shipped head. Speculative and target-only requests run at once, so every step mixes requests
of both kinds and of different lengths; in --exact a token's logits have the same bits whatever
shares its step (tests/test_exact_cpu.py), so equality must hold on every prompt.
"""

from __future__ import annotations

import pytest

from kernels import few_row_linear
from splitspec.launcher import LocalStack
from tests.conftest import CPU_FP32, START_TIMEOUT_S
from tests.helpers.prompts import pick_prompts
from tests.helpers.rpc import Router, greedy

UNAVAILABLE = few_row_linear.unavailable_reason()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        UNAVAILABLE is not None, reason=f"--exact needs the CPU kernels: {UNAVAILABLE}"
    ),
]
MAX_NEW = 40
LENGTHS = [(20, 60), (60, 120), (120, 200)]


def test_exact_target_makes_speculation_equal_target_only(tmp_path) -> None:
    stack = LocalStack([*CPU_FP32, "--exact"], [], log_dir=tmp_path,
                       draft_args=[["--method", "eagle", "--dtype", "float32"]])  # fmt: skip
    stack.start(timeout_s=START_TIMEOUT_S)
    router = Router(stack.router_address)
    try:
        prompts = [list(p.ids) for p in pick_prompts(LENGTHS, start=90)]
        requests = []
        for i, ids in enumerate(prompts):
            for speculate in (True, False):
                req = greedy(ids, MAX_NEW, request_id=f"p{i}-{int(speculate)}")
                req.speculation.enabled = speculate
                requests.append(req)
        streams = router.generate_many(requests)
    finally:
        router.close()
        stack.stop()
    spec, base = streams[0::2], streams[1::2]
    for i, (s, b) in enumerate(zip(spec, base, strict=True)):
        assert s.token_ids == b.token_ids, f"prompt {i}: speculative output differs"
        assert b.final.speculation.verify_steps == 0
    assert sum(s.final.speculation.accepted_tokens for s in spec) > 0, "no draft was accepted"
