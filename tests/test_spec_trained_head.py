"""The shipped EAGLE head on the real default model: lossless, and it gets drafts accepted.

Real processes and gRPC: SmolLM2-135M target (CPU, fp32, --exact where its kernels build) plus
one EAGLE replica with the head trained for it (the draft service's default for the default
model, hot vocabulary included when the head ships one). ShareGPT and HumanEval prompts run
concurrently with speculation on and off, so every step mixes requests of both kinds and
lengths and the batches differ between the two runs. Every speculative output must equal its
target-only twin token for token, no tie allowance (in --exact a token's logits have the same
bits whatever shares its step: tests/test_exact_cpu.py), and the head must do what training
bought: accept well above a random head (~1.0). The default numerics are checked lossless on
the default model by the container test (n-gram drafts), on the tiny model by
tests/test_spec_lossless.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernels import few_row_linear
from protos import generation_pb2 as pb
from splitspec.launcher import LocalStack
from tests.conftest import CPU_FP32, START_TIMEOUT_S
from tests.helpers.prompts import chat_ids, pick_prompts
from tests.helpers.rpc import Router, greedy

pytestmark = pytest.mark.slow
# --exact needs the CPU kernels (AVX-512 or AVX2); without them the default numerics run, equal
# in practice.
EXACT = ["--exact"] if few_row_linear.unavailable_reason() is None else []

MAX_NEW = 40  # 8 prompts x 2 modes; ~100 verify steps for the acceptance mean (3.0 measured)
LENGTHS = [(20, 60), (60, 120), (120, 200), (200, 300), (300, 450)]
NUM_HUMANEVAL = 3
# A trained head commits > 2 tokens per verify step on these prompts (offline replay: ~2.8);
# random weights commit ~1.0. The bar sits well below the trained figure so that it does not
# flake on short replies, and far above what an untrained head can reach.
MIN_ACCEPTANCE_LENGTH = 1.6


@pytest.fixture(scope="module")
def eagle_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    log_dir = tmp_path_factory.mktemp("stack-trained-head")
    stack = LocalStack(
        [*CPU_FP32, *EXACT],
        [],
        log_dir=log_dir,
        draft_args=[["--method", "eagle", "--dtype", "float32"]],  # default head: the shipped one
    )
    stack.start(timeout_s=START_TIMEOUT_S)
    client = Router(stack.router_address)
    try:
        yield client
    finally:
        client.close()
        stack.stop()


def humaneval_ids(count: int) -> list[list[int]]:
    from draft_service.eagle.train.data import humaneval_prompts

    return [chat_ids([{"role": "user", "content": text}]) for _, text in humaneval_prompts(count)]


def request(ids: list[int], speculate: bool, name: str) -> pb.GenerateRequest:
    req = greedy(ids, MAX_NEW, request_id=f"{name}-{'spec' if speculate else 'base'}")
    req.speculation.enabled = speculate
    return req


def test_trained_head_is_lossless_and_accepts(eagle_router: Router) -> None:
    prompts = [p.ids for p in pick_prompts(LENGTHS, start=40)] + humaneval_ids(NUM_HUMANEVAL)
    prompts = [list(p) for p in prompts]
    requests = [request(p, s, f"p{i}") for s in (True, False) for i, p in enumerate(prompts)]
    streams = eagle_router.generate_many(requests)
    spec, base = streams[: len(prompts)], streams[len(prompts) :]
    for i, (s, b) in enumerate(zip(spec, base, strict=True)):
        assert s.token_ids == b.token_ids, f"prompt {i}: speculative output differs"
        assert s.final.finish_reason == b.final.finish_reason, f"prompt {i}"
        assert b.final.speculation.verify_steps == 0, "target-only request speculated"
    steps = sum(s.final.speculation.verify_steps for s in spec)
    accepted = sum(s.final.speculation.accepted_tokens for s in spec)
    assert steps > 0, "no verify step ran: the drafter was never used"
    mean_length = (accepted + steps) / steps
    print(f"trained head: {accepted} drafts accepted in {steps} verify steps ({mean_length:.2f})")
    assert mean_length >= MIN_ACCEPTANCE_LENGTH
