"""A CPU target ends its idle OpenMP worker after a Verify, not after a Forward
(plumbing/omp_spin.py: at batch 1 the drafter's round comes next, on the same cores). Counted
in the real service process's /proc/<pid>/task."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from protos import target_pb2, target_pb2_grpc
from splitspec.launcher import ServiceProcess, free_ports, python_module
from tests.helpers.tiny_llama import engine_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc"),
]
GREEDY = target_pb2.SamplingConfig(temperature=0.0, top_p=1.0)
PROMPT = list(range(1, 17))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def settled_threads(pid: int, below: int, timeout_s: float = 5.0) -> int:
    """The process's thread count once under ``below``, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while threads(pid) >= below and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads(pid)


def test_a_verify_ends_the_idle_worker_and_a_forward_does_not(
    engine_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service manages its workers only where the user left them to it; conftest.py sets a
    # wait policy for every service the tests start, so this one starts without it.
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    (port,) = free_ports(1)
    model = ["--model", str(engine_model_dir), "--threads", "2", "--num-slots", "256"]
    command = python_module("target_service", "--port", str(port), *model)
    target = ServiceProcess("target", command, f"127.0.0.1:{port}", tmp_path / "target.log")
    target.start()
    try:
        target.wait_healthy(120)
        pid = target.started.pid
        with grpc.insecure_channel(target.address) as channel:
            stub = target_pb2_grpc.TargetModelStub(channel)
            prefill = target_pb2.ForwardItem(request_id="r", token_ids=PROMPT, start_pos=0,
                                             new_slots=list(range(len(PROMPT))), sample=True,
                                             sampling=GREEDY)  # fmt: skip
            reply = stub.Forward(target_pb2.ForwardRequest(items=[prefill]), timeout=60)
            after_forward = threads(pid)
            # Long past the 5 ms spin: the worker sleeps, but a Forward leaves it there.
            assert settled_threads(pid, below=after_forward, timeout_s=0.5) == after_forward
            start = len(PROMPT)
            tree = target_pb2.VerifyItem(request_id="r", start_pos=start,
                                         token_ids=[reply.next_token_ids[0], 5, 6],
                                         parent_indices=[-1, 0, 1],
                                         new_slots=[start, start + 1, start + 2])  # fmt: skip
            stub.Verify(target_pb2.VerifyRequest(items=[tree]), timeout=60)
            assert settled_threads(pid, below=after_forward) == after_forward - 1
    finally:
        target.stop()
