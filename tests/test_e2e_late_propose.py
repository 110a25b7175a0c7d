"""A draft replica late with its Propose, through the whole stack: no whole-context re-ingest.

One EAGLE replica (the oracle head, so drafts are accepted) serves four greedy streams. It is
SIGSTOPped while a thread of it works (on this CPU stack, amid a Propose) for longer than its
Propose deadline, so that round's Propose misses it: the router
skips the replica, runs root-only rounds, and later sends the missed updates merged with the
next one. The replica, resumed, has applied the late update meanwhile; it must drop that part
of the merged update and go on (draft_service/late_updates.py), where it used to answer
needs_context and have every request's context streamed to it again. The router's /metrics
count the replica's Ingest calls: one a request (its prompt), none more. Outputs stay
target-only's.

The stop waits for the router's measured deadline (the first Proposes run under a 2 s initial
one), and the check for drafting after it reads the router's live /metrics count: the streams
are long and are cancelled once drafting has gone on after the stop, and each stream's tokens
so far must equal target-only's first tokens. (GetServerStatus counts accepted drafts when
requests finish: waiting on it tied the stop to the first stream's end, and on the H200 box's
16 cores the 400-token streams then ended before the replica drafted again.)
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

import grpc
import pytest

from router.replica_health import DeadlinePolicy
from splitspec.launcher import free_ports
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    oracle_head_dir_fixture,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(300)
STREAMS = 4
MAX_NEW = 1800  # never reached: cancelled once the check is done (prompts <= 40, context 2048)
MISS = "missed a Propose"  # the router's log line (router/draft_pool.py)


def metrics(http: str) -> str:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as reply:
        return reply.read().decode()


def draft_calls(http: str, method: str) -> int:
    """Calls of ``method`` the router made to draft replicas (its draft_rpc_latency histogram)."""
    pattern = rf'draft_rpc_latency_seconds_count\{{[^}}]*method="{method}"[^}}]*\}} (\S+)'
    return int(sum(float(c) for c in re.findall(pattern, metrics(http))))


def accepted_drafts(http: str) -> int:
    """Drafts accepted so far, counted as each verify commits (GetServerStatus counts
    finished requests only)."""
    pattern = r"(?m)^\S*spec_decode_num_accepted_tokens_total(?:\{[^}]*\})? (\S+)"
    return int(sum(float(c) for c in re.findall(pattern, metrics(http))))


def running_threads(pid: int) -> set[str]:
    running = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "R":
                running.add(stat.parent.name)
        except OSError:
            continue  # a thread gone meanwhile
    return running


def working(pid: int) -> bool:
    """Whether a thread of the process runs for a while (on the CPU, the drafter amid a
    Propose; gRPC's poller runs for microseconds when a message comes in)."""
    first = running_threads(pid)
    if not first:
        return False
    time.sleep(0.001)
    return bool(first & running_threads(pid))


def stop_amid_propose(pid: int, router_log: Path) -> None:
    """SIGSTOP the replica while it works until the router logs a missed Propose deadline: the
    Propose it has taken in (or the next one) misses it, and the replica finishes it, applying
    its update, once resumed. Until the miss, not for a fixed time: the deadline is the
    replica's measured p99, which a loaded CI box stretches (0.4 s once missed none)."""
    deadline = time.monotonic() + 30
    while not working(pid):
        assert time.monotonic() < deadline, "the replica never worked"
    missed_before = router_log.read_text().count(MISS)
    os.kill(pid, signal.SIGSTOP)
    try:
        while router_log.read_text().count(MISS) == missed_before:
            assert time.monotonic() < deadline, "no Propose missed its deadline in 30 s"
            time.sleep(0.01)
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_for(count: Callable[[], int], at_least: int, what: str) -> None:
    deadline = time.monotonic() + 60
    while count() < at_least:
        assert time.monotonic() < deadline, f"the streams got fewer than {at_least} {what}"
        time.sleep(0.01)


class CutStreams:
    """Greedy streams read on threads of their own until ``cut``, which cancels them."""

    def __init__(self, router: Router, requests: list) -> None:
        self.calls = [router.stub.Generate(r, timeout=240) for r in requests]
        self.tokens: list[list[int]] = [[] for _ in requests]
        self.threads = [
            threading.Thread(target=self._read, args=(i,)) for i in range(len(requests))
        ]
        for thread in self.threads:
            thread.start()

    def _read(self, i: int) -> None:
        try:
            for item in self.calls[i]:
                self.tokens[i] += item.token_ids
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                raise

    def cut(self) -> list[list[int]]:
        for call in self.calls:
            call.cancel()
        for thread in self.threads:
            thread.join()
        return self.tokens


def test_a_late_replica_goes_on_from_its_late_update_without_a_reingest(
    tmp_path: Path, tiny_model_dir: Path, oracle_head_dir: Path
) -> None:
    eagle = ["--method", "eagle", "--eagle-head", str(oracle_head_dir), "--threads", "1"]
    prompts = random_prompts(seed=11, count=STREAMS, vocab_size=49152, max_len=40)
    (http_port,) = free_ports(1)
    http = f"127.0.0.1:{http_port}"
    router_args = ["--http-port", str(http_port)]
    with running_stack(tmp_path, tiny_model_dir, [eagle], router_args=router_args) as (
        stack,
        router,
    ):
        streams = CutStreams(
            router, [ids_request(p, MAX_NEW, True, ignore_eos=True) for p in prompts]
        )
        try:
            # Past the first Proposes, timed against the 2 s initial deadline: the router's
            # deadline is the replica's measured one (router/replica_health.py).
            proposes = partial(draft_calls, http, "Propose")
            wait_for(proposes, 2 * DeadlinePolicy.min_samples, "Proposes")
            stop_amid_propose(stack.drafts[0].process.pid, tmp_path / "router.log")
            # Drafting again after the stop: the merged updates went to the replica.
            drafts = partial(accepted_drafts, http)
            wait_for(drafts, drafts() + 8 * STREAMS, "drafts accepted")
        finally:
            got = streams.cut()
        misses = (tmp_path / "router.log").read_text().count(MISS)
        ingests = draft_calls(http, "Ingest")
        plain = [
            ids_request(p, len(g), False, ignore_eos=True)
            for p, g in zip(prompts, got, strict=True)
        ]
        reference = [s.token_ids for s in router.generate_many(plain)]
        status = router.status()
    assert misses >= 1, "the stop missed no Propose deadline: nothing was late"
    assert all(len(g) < MAX_NEW for g in got), "a stream ran its whole length"
    assert got == reference
    assert all(r.healthy for r in status.draft_replicas)
    assert ingests == STREAMS, (
        f"{ingests} Ingest calls for {STREAMS} prompts: a late replica was re-ingested"
    )
