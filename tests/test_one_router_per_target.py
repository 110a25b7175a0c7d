"""One router drives a target at a time: a second one waits, and a hung one hands over.

A router owns the KV slots it hands out. Two routers on one target each wrote their requests' KV
into slots the other had given out too: measured on 2026-12-05 with three requests through each
router at once, all six outputs were wrong and nothing reported an error. The second router's
start had also released the first router's request in flight, which then failed NOT_FOUND. Now
a router claims the target before it serves and names itself on every call
(target_service/ownership.py). A second router waits, naming the first, until the first's claim
lapses (--target-claim-lease after its last call, 5 s by default; LEASE_S here) or is given up
(the first stops).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import grpc
import pytest

from protos import target_pb2, target_pb2_grpc
from splitspec import cli
from splitspec.launcher import ServiceProcess, free_ports
from target_service.ownership import Held, Ownership
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    running_stack,
    tiny_model_dir_fixture,
    wait_serving,
)

pytestmark = pytest.mark.timeout(240)
PROMPT = list(range(1, 40))
WAITING = "to be free: this target is driven by another router"
LEASE_S = 1.5  # the first router's --target-claim-lease: a hung one hands over sooner than 5 s


@pytest.mark.serial  # times the handover (a window of ~3 s): alone, after the parallel run
def test_a_second_router_waits_and_a_hung_one_hands_over(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    lease = ["--target-claim-lease", str(LEASE_S)]
    with running_stack(tmp_path, tiny_model_dir, router_args=lease) as (stack, first):
        expected = first.generate(ids_request(PROMPT, 16, False, ignore_eos=True)).token_ids
        second = second_router(stack.target_address, tiny_model_dir, tmp_path / "second.log")
        first_pid = stack.router.started.pid
        try:
            wait_for_line(tmp_path / "second.log", WAITING)
            meanwhile = first.generate(ids_request(PROMPT, 16, False, ignore_eos=True))
            assert meanwhile.token_ids == expected, "the first router's output changed"
            assert second.started.poll() is None
            os.kill(first_pid, signal.SIGSTOP)  # hung: its claim lapses LEASE_S after its last call
            hung_at = time.monotonic()
            second.wait_healthy(60)
            handover_s = time.monotonic() - hung_at
            print(f"the second router served {handover_s:.1f} s after the hang")
            other = Router(second.address)
            again = other.generate(ids_request(PROMPT, 16, False, ignore_eos=True))
            other.close()
            os.kill(first_pid, signal.SIGCONT)
            refused = refusal(first)
            reason = unavailable_reason(first)
            status_exit = cli.main(["status", "--address", stack.router_address])
            second.stop()  # SIGTERM: it gives the target up, and the first serves again
            wait_serving(first, 30)
            last = first.generate(ids_request(PROMPT, 16, False, ignore_eos=True)).token_ids
        finally:
            os.kill(first_pid, signal.SIGCONT)
            second.stop()

    assert again.token_ids == expected
    # From the first router's last renewal (at most 0.25 s before the stop): the lease, not 5 s.
    assert LEASE_S - 0.3 <= handover_s < 4.5, handover_s
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "driven by another router" in (refused.details() or ""), refused.details()
    assert "driven by another router" in reason, reason  # GetServerStatus says why too
    assert status_exit == 3  # `splitspec status`: up, but refusing requests
    assert last == expected


def test_a_claim_is_refused_while_live_and_taken_once_lapsed() -> None:
    now = [0.0]
    owner = Ownership(clock=lambda: now[0])
    owner.claim("a", "router A", lease_s=5.0)
    with pytest.raises(Held, match=r"router A; its last call 0\.0 s ago"):
        owner.claim("b", "router B", lease_s=5.0)
    now[0] = 4.0
    owner.admit("a")  # a call renews the claim
    now[0] = 8.5
    with pytest.raises(Held):
        owner.admit("b")
    owner.admit("")  # a caller that names no router is not checked
    now[0] = 9.0  # 5 s after A's last call
    owner.claim("b", "router B", lease_s=5.0)
    with pytest.raises(Held, match="router B"):
        owner.admit("a")


def test_a_router_that_cannot_serve_gives_its_claim_up(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A router that claimed the target and then could not bind its port held the claim until
    it lapsed (it gave it up only once serving): the next router waited for nothing."""
    with running_stack(tmp_path, tiny_model_dir) as (stack, _):
        stack.router.stop()  # SIGTERM: the first router gives the target up
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            log = tmp_path / "unbound.log"
            unbound = second_router(stack.target_address, tiny_model_dir, log, port)
            assert unbound.started.wait(60) != 0
        assert "cannot bind" in log.read_text()
        with grpc.insecure_channel(stack.target_address) as channel:
            claim = target_pb2.ClaimRequest(router_id="next", router_name="next", lease_s=5.0)
            target_pb2_grpc.TargetModelStub(channel).Claim(claim, timeout=10)  # not held


def test_a_call_claims_a_free_target_and_a_claim_given_up_is_free() -> None:
    owner = Ownership(clock=lambda: 0.0)
    owner.admit("a")  # no claim was live: a router's call takes the target
    with pytest.raises(Held):
        owner.claim("b", "router B", lease_s=5.0)
    owner.give_up("b")  # not the owner's: changes nothing
    with pytest.raises(Held):
        owner.admit("b")
    owner.give_up("a")
    owner.claim("b", "router B", lease_s=5.0)


def second_router(target: str, model_dir: Path, log: Path, port: int = 0) -> ServiceProcess:
    port = port or free_ports(1)[0]
    command = [sys.executable, "-m", "router", "--model", str(model_dir), "--target", target,
               "--port", str(port)]  # fmt: skip
    router = ServiceProcess("second router", command, f"127.0.0.1:{port}", log)
    router.start()
    return router


def wait_for_line(log: Path, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"{log} never said {text!r}"
        time.sleep(0.1)


def refusal(router: Router) -> grpc.RpcError:
    """The error of a request through ``router``, which must fail."""
    with pytest.raises(grpc.RpcError) as failed:
        router.generate(ids_request(PROMPT, 16, False, ignore_eos=True), 30)
    return failed.value


def unavailable_reason(router: Router, timeout_s: float = 10.0) -> str:
    """GetServerStatus's reason to refuse requests, once it gives one."""
    deadline = time.monotonic() + timeout_s
    while not (reason := router.status().unavailable_reason) and time.monotonic() < deadline:
        time.sleep(0.05)
    return reason
