"""Requests that died with a router, or with a hung target, are not held for good.

SIGKILLed while four streams ran, a router left their requests on the target (request rows) and
on the draft (contexts): with rows for six requests, the restarted router's next four requests
all failed UNAVAILABLE ("all 6 request rows are in use"). A target hung (SIGSTOPped) until the
router failed its requests kept their rows too (their releases could not reach it), and once
resumed refused every new request. A router now releases what its target holds as it starts
and when the target is back after a loss, and what a draft replica holds before it first serves.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from protos import draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from splitspec.launcher import LocalStack
from tests.helpers.rpc import BackgroundStream, held_requests
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    START_TIMEOUT_S,
    Router,
    ids_request,
    oracle_head_dir_fixture,
    running_stack,
    tiny_model_dir_fixture,
    wait_serving,
)

pytestmark = pytest.mark.timeout(240)
PROMPT = list(range(1, 40))
NUM_ROWS = 6  # the target's request rows: the dead router's four leave two
NUM_STREAMS = 4
RPC_TIMEOUT_S = 2  # the router's deadline of a call to the target
# The step fails after RPC_TIMEOUT_S, its releases RPC_TIMEOUT_S later; the target is found lost
# after two failed health checks of 2 s each.
HANG_S = 7.0  # all of it
STALL_S = 3.0  # with --rpc-timeout 1: the step and its releases fail, the target is not lost


def test_a_restarted_router_finds_nothing_the_dead_one_held(
    tmp_path: Path, tiny_model_dir: Path, oracle_head_dir: Path
) -> None:
    eagle = ["--method", "eagle", "--eagle-head", str(oracle_head_dir)]
    target_args = ["--max-requests", str(NUM_ROWS)]
    dead_ids = [f"crash-{i}" for i in range(NUM_STREAMS)]
    with running_stack(tmp_path, tiny_model_dir, [eagle], target_args) as (stack, router):
        expected = router.generate(ids_request(PROMPT, 24, False, ignore_eos=True)).token_ids
        long = [ids_request(PROMPT, 4000, True, request_id=i, ignore_eos=True) for i in dead_ids]
        streams = [BackgroundStream(router, request) for request in long]
        for stream in streams:
            stream.wait_for_tokens(8)
        during = held_requests(stack.target.address, stack.drafts[0].address)
        stack.router.kill()
        for stream in streams:
            stream.reader.join(60)
        stack.router.start()
        stack.router.wait_healthy(START_TIMEOUT_S)
        stack.wait_drafts_serving(START_TIMEOUT_S)
        again = router.generate_many([ids_request(PROMPT, 24, True, ignore_eos=True)] * NUM_STREAMS)
        held = still_held(stack.target.address, stack.drafts[0].address, dead_ids)
        settled = held_requests(stack.target.address, stack.drafts[0].address, settle_s=5.0)
    log = (tmp_path / "router.log").read_text()  # the restarted router's

    assert all(len(s.errors) == 1 for s in streams), "the streams outlived their router?"
    assert all(s.token_ids == expected for s in again), "a request after the restart failed"
    assert all(s.final.speculation.accepted_tokens > 0 for s in again)
    # GetInfo's count while they ran: the four streams (and the first request, if its release
    # was still on its way).
    assert all(NUM_STREAMS <= n <= NUM_STREAMS + 1 for n in during.values()), during
    assert held == {"target": 0, "draft": 0}
    assert settled == {"target": 0, "draft": 0}  # nor any other request, once released
    assert f"the target held {NUM_STREAMS} requests no router serves" in log
    assert f"held {NUM_STREAMS} contexts no router serves" in log


def still_held(target: str, draft: str, request_ids: list[str]) -> dict[str, int]:
    """How many of ``request_ids`` each service still held (releasing them to count)."""
    with grpc.insecure_channel(target) as channel:
        release = target_pb2_grpc.TargetModelStub(channel).Release
        on_target = release(target_pb2.ReleaseRequest(request_ids=request_ids), timeout=10)
    with grpc.insecure_channel(draft) as channel:
        release = draft_pb2_grpc.DraftModelStub(channel).Release
        on_draft = release(draft_pb2.ReleaseRequest(request_ids=request_ids), timeout=10)
    return {"target": on_target.num_released, "draft": on_draft.num_released}


def test_a_target_back_after_a_hang_holds_nothing_of_the_failed_requests(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    target_args = ["--max-requests", str(NUM_STREAMS)]  # the failed requests held every row
    router_args = ["--rpc-timeout", str(RPC_TIMEOUT_S)]  # the hung step fails in seconds
    with running_stack(tmp_path, tiny_model_dir, [], target_args, router_args) as (stack, router):
        expected = router.generate(ids_request(PROMPT, 16, False, ignore_eos=True)).token_ids
        streams = streams_through_a_stall(stack, router, HANG_S)
        wait_serving(router)
        again = router.generate_many([ids_request(PROMPT, 16, False, ignore_eos=True)] * 4)
    log = (tmp_path / "router.log").read_text()

    assert all(len(s.errors) == 1 for s in streams), "the streams outlived the hang?"
    assert all(s.token_ids == expected for s in again), "a request after the hang failed"
    assert "target lost" in log and "release of 4 requests failed" in log, "missed the path"
    assert f"the target held {NUM_STREAMS} requests no router serves (back after a loss)" in log


def test_releases_lost_to_a_short_stall_are_sent_again(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A stall past --rpc-timeout but too short for the health checks to call the target lost
    (a reset connection does the same) failed the requests and their releases: their rows stayed
    held, and with four rows every later request failed ("all 4 request rows are in use")."""
    target_args = ["--max-requests", str(NUM_STREAMS)]
    router_args = ["--rpc-timeout", "1"]
    with running_stack(tmp_path, tiny_model_dir, [], target_args, router_args) as (stack, router):
        expected = router.generate(ids_request(PROMPT, 16, False, ignore_eos=True)).token_ids
        streams = streams_through_a_stall(stack, router, STALL_S)
        again = router.generate_many([ids_request(PROMPT, 16, False, ignore_eos=True)] * 4)
    log = (tmp_path / "router.log").read_text()

    assert all(len(s.errors) == 1 for s in streams), "the streams outlived the stall?"
    assert "release of 4 requests failed" in log, "the stall did not test the path"
    assert "target lost" not in log, "the stall was long enough to lose the target"
    assert all(s.token_ids == expected for s in again), "a request after the stall failed"


def streams_through_a_stall(
    stack: LocalStack, router: Router, stall_s: float
) -> list[BackgroundStream]:
    """NUM_STREAMS long streams, running, then the target SIGSTOPped for ``stall_s``."""
    long = ids_request(PROMPT, 4000, False, ignore_eos=True)
    streams = [BackgroundStream(router, long) for _ in range(NUM_STREAMS)]
    for stream in streams:
        stream.wait_for_tokens(8)
    os.kill(stack.target.started.pid, signal.SIGSTOP)
    try:
        time.sleep(stall_s)
    finally:
        os.kill(stack.target.started.pid, signal.SIGCONT)
    for stream in streams:
        stream.reader.join(60)
    return streams
