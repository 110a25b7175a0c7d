"""Losing a draft replica mid-generation costs speed, never a request or a token.

Two EAGLE replicas (the oracle head, so drafts get accepted) serve several concurrent long
greedy requests; one replica is SIGKILLed while requests run on both. Every request must finish
normally with exactly its target-only output, keep speculating afterwards (its context is
rebuilt on the surviving replica from the target's hidden pool), and the router must then
report the killed replica unhealthy. Restarted on its address, the replica comes back into
rotation empty and serves new requests, again without changing an output.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from protos import generation_pb2 as pb
from splitspec.launcher import LocalStack
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    Stream,
    ids_request,
    oracle_head_dir_fixture,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(300)  # a hung service fails this module's test, not the run
NUM_REQUESTS = 6
MAX_NEW = 200  # the kill lands 25-46 tokens in (2-core box): most of each request is after it
RERUN_NEW = 80
KILL_AFTER_TOKENS = 24  # every request has streamed this many tokens before the kill
WAIT_S = 120.0


@dataclass
class Live:
    """A stream read on its own thread, each item stamped with its arrival time."""

    items: list[tuple[float, pb.GenerateResponse]] = field(default_factory=list)
    error: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def num_tokens(self) -> int:
        return sum(len(item.token_ids) for _, item in self.items)

    @property
    def token_ids(self) -> list[int]:
        return [t for _, item in self.items for t in item.token_ids]


def read(stub, request: pb.GenerateRequest, live: Live) -> None:
    try:
        for item in stub.Generate(request, timeout=WAIT_S):
            live.items.append((time.monotonic(), item))
    except Exception as err:  # the test reports it
        live.error = err
    finally:
        live.done.set()


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def test_sigkill_of_a_replica_fails_nothing(
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    oracle_head_dir: Path,
) -> None:
    eagle = ["--method", "eagle", "--eagle-head", str(oracle_head_dir)]
    log_dir = tmp_path_factory.mktemp("spec-replica-failure")
    prompts = random_prompts(seed=21, count=NUM_REQUESTS, vocab_size=49152, max_len=120)
    with running_stack(log_dir, tiny_model_dir, [eagle, eagle]) as (stack, router):
        base = router.generate_many(
            [ids_request(p, MAX_NEW, False, ignore_eos=True) for p in prompts]
        )
        lives = [Live() for _ in prompts]
        threads = [
            threading.Thread(
                target=read,
                args=(
                    router.stub,
                    ids_request(p, MAX_NEW, True, request_id=f"kill-{i}", ignore_eos=True),
                    live,
                ),
            )
            for i, (p, live) in enumerate(zip(prompts, lives, strict=True))
        ]
        for t in threads:
            t.start()
        try:
            wait_until(
                lambda: all(live.num_tokens >= KILL_AFTER_TOKENS for live in lives),
                WAIT_S,
                "requests did not get going",
            )
            replicas = router.status().draft_replicas
            assert [r.healthy for r in replicas] == [True, True]
            assert all(r.num_requests > 0 for r in replicas), f"not spread: {replicas}"
            killed_at = time.monotonic()
            tokens_at_kill = [live.num_tokens for live in lives]
            stack.drafts[0].kill()
            wait_until(
                lambda: all(live.done.is_set() for live in lives), WAIT_S, "requests did not finish"
            )
        finally:
            for t in threads:
                t.join(WAIT_S)
        status = router.status()
        restarted = restart_and_rerun(stack, router, prompts)

    assert all(n < MAX_NEW // 2 for n in tokens_at_kill), f"killed too late: {tokens_at_kill}"
    for i, (live, b) in enumerate(zip(lives, base, strict=True)):
        assert live.error is None, f"request {i} failed: {live.error!r}"
        final = live.items[-1][1]
        assert final.finish_reason == pb.FINISH_REASON_LENGTH, i
        assert final.usage.completion_tokens == MAX_NEW, i
        assert live.token_ids == b.token_ids, f"request {i}: output changed by the kill"
        # Still speculating after the kill: a verified block of 3+ tokens arrived afterwards.
        after = [item for t, item in live.items if t > killed_at]
        assert any(len(item.token_ids) >= 3 for item in after), f"request {i} stopped speculating"

    by_address = {r.address: r for r in status.draft_replicas}
    assert not by_address[stack.drafts[0].address].healthy
    assert by_address[stack.drafts[1].address].healthy
    assert status.num_running == 0
    assert sum(r.num_requests for r in status.draft_replicas) == 0, "finished requests assigned"

    streams, during = restarted
    assert all(r.healthy for r in during), during
    assert all(r.num_requests > 0 for r in during), f"restarted replica unused: {during}"
    for i, (s, b) in enumerate(zip(streams, base, strict=True)):
        assert s.token_ids == b.token_ids[:RERUN_NEW], f"request {i} after the restart"
        assert s.final.speculation.accepted_tokens > 0, i


def restart_and_rerun(
    stack: LocalStack, router: Router, prompts: list[list[int]]
) -> tuple[list[Stream], list]:
    """Restarts the killed replica, waits for the router to take it back, reruns the prompts
    and returns their streams plus the replica status seen while they ran."""
    stack.drafts[0].start()
    stack.wait_drafts_serving(WAIT_S)
    lives = [Live() for _ in prompts]
    threads = [
        threading.Thread(
            target=read, args=(router.stub, ids_request(p, RERUN_NEW, True, ignore_eos=True), live)
        )
        for p, live in zip(prompts, lives, strict=True)
    ]
    for t in threads:
        t.start()
    wait_until(lambda: all(live.num_tokens >= 8 for live in lives), WAIT_S, "rerun stalled")
    during = list(router.status().draft_replicas)
    for t in threads:
        t.join(WAIT_S)
    assert all(live.error is None for live in lives), [live.error for live in lives]
    return [Stream([item for _, item in live.items]) for live in lives], during
