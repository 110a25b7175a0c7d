"""SIGTERM drains a service (plumbing/drain.py): how Kubernetes and podman stop containers.

The router, hit by SIGTERM while a long stream runs, refuses new calls but lets that stream
finish in full, then exits 0; an idle draft service exits 0 at once (without a handler the
exit status would be -SIGTERM, and as a container's PID 1 it would ignore the signal). A draft
drained while the router speculates with it over the router's open stream exits once its call
in flight is answered, not at the end of its grace period, and the router's stream goes on
target-only with the same tokens; so does an idle target with the router's stream open.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest

from plumbing.drain import GRACE_ENV
from splitspec.launcher import LocalStack
from tests.helpers.processes import ngram_draft_process
from tests.helpers.rpc import BackgroundStream
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    FP64,
    START_TIMEOUT_S,
    Router,
    ids_request,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)
MAX_NEW = 600
PROMPT = list(range(1, 40))
LONG_GRACE_S = 60  # a drain that waited for its grace would outlast the exits allowed below


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
    try:
        stream = BackgroundStream(router, ids_request(PROMPT, MAX_NEW, False, ignore_eos=True))
        stream.wait_for_tokens(5)
        stack.router.started.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert stream.reader.is_alive(), "the stream ended before SIGTERM: the test proves nothing"
        with pytest.raises(grpc.RpcError) as refused:
            router.generate(ids_request([1, 2, 3], 4, False), timeout_s=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert len(stream.finish()) == MAX_NEW
        assert stack.router.process.wait(30) == 0
    finally:
        router.close()
        stack.stop()


def test_a_draft_drained_mid_stream_exits_at_once_and_changes_nothing(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GRACE_ENV, str(LONG_GRACE_S))
    stack = LocalStack(
        ["--model", str(tiny_model_dir), *FP64, "--threads", "1"],
        ["--model", str(tiny_model_dir)],
        log_dir=tmp_path,
        draft_args=[["--method", "ngram"]],
    )
    stack.start(START_TIMEOUT_S)
    router = Router(stack.router_address)
    try:
        alone = router.generate(ids_request(PROMPT, MAX_NEW, False, ignore_eos=True)).token_ids
        stream = BackgroundStream(router, ids_request(PROMPT, MAX_NEW, True, ignore_eos=True))
        stream.wait_for_tokens(5)
        (draft,) = stack.drafts
        started = time.monotonic()
        draft.started.send_signal(signal.SIGTERM)
        assert draft.started.wait(LONG_GRACE_S / 4) == 0
        print(f"the draft drained in {time.monotonic() - started:.2f} s")
        assert stream.reader.is_alive(), "the stream ended before the drain: nothing was tested"
        assert stream.finish() == alone
        assert stream.items[-1].speculation.verify_steps > 0, "the draft never served the stream"
        stack.target.started.send_signal(signal.SIGTERM)  # idle, the router's stream open
        assert stack.target.started.wait(LONG_GRACE_S / 4) == 0
    finally:
        router.close()
        stack.stop()
