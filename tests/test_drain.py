"""SIGTERM drains a service (plumbing/drain.py): how Kubernetes and podman stop containers.

The router, hit by SIGTERM while a long stream runs, refuses new calls but lets that stream
finish in full, then exits 0; an idle draft service exits 0 at once (without a handler the
exit status would be -SIGTERM, and as a container's PID 1 it would ignore the signal).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from protos import generation_pb2 as pb
from splitspec.launcher import LocalStack
from tests.helpers.processes import ngram_draft_process
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    FP64,
    START_TIMEOUT_S,
    Router,
    ids_request,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)
MAX_NEW = 600


def test_an_idle_draft_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    draft = ngram_draft_process(tmp_path / "draft.log")
    draft.start()
    try:
        draft.wait_healthy(START_TIMEOUT_S)
        draft.process.send_signal(signal.SIGTERM)
        assert draft.process.wait(10) == 0
        assert "SIGTERM: draining" in (tmp_path / "draft.log").read_text()
    finally:
        draft.stop()


def test_the_router_finishes_running_streams_on_sigterm(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    stack = LocalStack(
        ["--model", str(tiny_model_dir), *FP64, "--threads", "1"],
        ["--model", str(tiny_model_dir)],
        log_dir=tmp_path,
    )
    stack.start(START_TIMEOUT_S)
    router = Router(stack.router_address)
    items: list[pb.GenerateResponse] = []
    errors: list[Exception] = []

    def read() -> None:
        request = ids_request(list(range(1, 40)), MAX_NEW, False, ignore_eos=True)
        try:
            items.extend(router.stub.Generate(request, timeout=120))
        except Exception as err:  # reported below
            errors.append(err)

    reader = threading.Thread(target=read)
    try:
        reader.start()
        while sum(len(i.token_ids) for i in items) < 5 and reader.is_alive():
            time.sleep(0.005)
        stack.router.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert reader.is_alive(), "the stream ended before SIGTERM: the test proves nothing"
        with pytest.raises(grpc.RpcError) as refused:
            router.generate(ids_request([1, 2, 3], 4, False), timeout_s=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        reader.join(120)
        assert not errors, errors
        assert sum(len(i.token_ids) for i in items) == MAX_NEW
        assert items[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert stack.router.process.wait(30) == 0
    finally:
        router.close()
        stack.stop()
