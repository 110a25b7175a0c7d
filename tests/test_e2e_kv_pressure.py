"""KV pressure under ``--kv-policy retract``: a pool far smaller than the running requests need
retracts some of them (requeued, recomputed) and every one still completes with the output it
has without pressure, its stream neither repeating nor dropping a token.

One real stack on the default model with an n-gram draft replica and a 160-slot pool serves
8 concurrent requests of ~60 slots each (more than pool/4, ~480 in all): greedy with
speculation on, greedy with it off, and seeded sampling (its draws are keyed by seed and
position, so a recompute reproduces them). Their references come from the shared stack, whose
pool is ample. Afterwards retractions are counted in GetServerStatus and /metrics, and every
slot is back: free or held by the radix cache.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest

from protos import generation_pb2 as pb
from splitspec.launcher import LocalStack
from tests.conftest import CPU_FP32, START_TIMEOUT_S
from tests.helpers.prompts import pick_prompts
from tests.helpers.reference import HFReference, TieCase, assert_same_greedy
from tests.helpers.rpc import Router, assert_slots_accounted, greedy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # stack starts included

POOL = 160
MAX_NEW = 32
MAX_TREE = 4  # the router's lookahead: a request may need prompt + MAX_NEW - 1 + MAX_TREE
LENGTHS = [(20, 32)] * 8
KINDS = ["spec"] * 3 + ["plain"] * 3 + ["seeded"] * 2


def request_of(ids: tuple[int, ...], kind: str, index: int) -> pb.GenerateRequest:
    request = greedy(ids, MAX_NEW, request_id=f"kv-{kind}-{index}")
    request.sampling.ignore_eos = True  # every request runs its full length: steady pressure
    request.speculation.enabled = kind == "spec"
    if kind == "seeded":
        request.sampling.temperature = 0.8
        request.sampling.top_p = 0.95
        request.sampling.seed = 1000 + index
    return request


@pytest.fixture(scope="module")
def pressured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack(
        [*CPU_FP32, "--num-slots", str(POOL)],
        ["--kv-policy", "retract", "--max-tree-tokens", str(MAX_TREE)],
        log_dir=tmp_path_factory.mktemp("kv-pressure"),
        draft_args=[["--method", "ngram"]],
        http=True,
    )
    stack.start(timeout_s=START_TIMEOUT_S)
    try:
        yield stack
    finally:
        stack.stop()


def scrape_preemptions(http_address: str) -> float:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    (line,) = [x for x in lines if x.startswith("splitspec:num_preemptions_total{")]
    return float(line.rsplit(" ", 1)[1])


def test_retracted_requests_complete_with_their_unpressured_output(
    pressured: LocalStack, router: Router, hf: HFReference, tie_cases: list[TieCase]
) -> None:
    prompts = [p.ids for p in pick_prompts(LENGTHS, start=3000)]
    pairs = enumerate(zip(prompts, KINDS, strict=True))
    requests = [request_of(ids, kind, i) for i, (ids, kind) in pairs]
    needs = [len(p) + MAX_NEW - 1 + MAX_TREE for p in prompts]
    assert min(needs) > POOL // 4 and sum(needs) > 2.5 * POOL  # far more than the pool

    small = Router(pressured.router_address)
    try:
        baseline = small.wait_idle()
        assert baseline.num_free_slots == POOL and baseline.num_retractions == 0
        started = time.perf_counter()
        pressed, max_running = small.generate_many_observed(requests)
        print(f"{len(requests)} requests on {POOL} slots: {time.perf_counter() - started:.1f} s, "
              f"at most {max_running} running at once")
        status = small.wait_idle()
    finally:
        small.close()
    reference = router.generate_many(requests)  # the shared stack: ample slots, no pressure

    print(f"retractions: {status.num_retractions}; spec {status.speculation}")
    assert status.num_retractions > 0, "the pool was never short: no pressure was tested"
    assert scrape_preemptions(pressured.http_address) == status.num_retractions
    assert status.speculation.verify_steps > 0, "speculation never ran"
    assert_slots_accounted(status)
    for ids, kind, got, want in zip(prompts, KINDS, pressed, reference, strict=True):
        name = f"kv pressure: {got.final.request_id}"
        assert got.final.finish_reason == pb.FINISH_REASON_LENGTH, name
        assert got.final.usage.completion_tokens == len(got.token_ids) == MAX_NEW, name
        assert got.final.usage.prompt_tokens == len(ids), name
        if kind == "seeded":
            assert got.token_ids == want.token_ids, name
        else:
            gap = hf.gap_after(ids, want.token_ids)
            assert_same_greedy(name, got.token_ids, want.token_ids, gap, tie_cases)
        if got.token_ids == want.token_ids:  # the text streams in other blocks, to the same end
            assert got.text == want.text, name
