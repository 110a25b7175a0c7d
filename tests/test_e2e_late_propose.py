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
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

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
MAX_NEW = 400
STOP_S = 0.4  # past the 20 ms deadline floor and any p99 a loaded CI box gives a Propose


def ingest_calls(http: str) -> int:
    """Ingest calls the router made to draft replicas (its draft_rpc_latency histogram)."""
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts = re.findall(r'draft_rpc_latency_seconds_count\{[^}]*method="Ingest"[^}]*\} (\S+)', text)
    return int(sum(float(c) for c in counts))


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


def stop_amid_propose(pid: int) -> None:
    """SIGSTOP the replica while it works, past its deadline: the Propose it has taken in
    misses the deadline, and the replica finishes it (applying its update) once resumed."""
    deadline = time.monotonic() + 30
    while not working(pid):
        assert time.monotonic() < deadline, "the replica never worked"
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(STOP_S)
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_for_drafts(router: Router, accepted: int) -> None:
    deadline = time.monotonic() + 60
    while router.status().speculation.accepted_tokens < accepted:
        assert time.monotonic() < deadline, f"the streams got fewer than {accepted} drafts accepted"
        time.sleep(0.01)


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
        spec = [ids_request(p, MAX_NEW, True, ignore_eos=True) for p in prompts]
        got: list = []
        streams = threading.Thread(target=lambda: got.extend(router.generate_many(spec)))
        streams.start()
        try:
            wait_for_drafts(router, 8 * STREAMS)
            stop_amid_propose(stack.drafts[0].process.pid)
            # Drafting again after the stop: the merged updates went to the replica.
            wait_for_drafts(router, router.status().speculation.accepted_tokens + 8 * STREAMS)
        finally:
            streams.join()
        misses = (tmp_path / "router.log").read_text().count("missed a Propose")
        ingests = ingest_calls(http)
        plain = [ids_request(p, MAX_NEW, False, ignore_eos=True) for p in prompts]
        reference = [s.token_ids for s in router.generate_many(plain)]
        status = router.status()
    assert misses >= 1, "the stop missed no Propose deadline: nothing was late"
    assert [s.token_ids for s in got] == reference
    assert all(r.healthy for r in status.draft_replicas)
    assert ingests == STREAMS, (
        f"{ingests} Ingest calls for {STREAMS} prompts: a late replica was re-ingested"
    )
