"""A target that hangs fails its streams within seconds, not at the step's deadline.

SIGSTOPped while four streams ran, the target was found lost by the router's health checks in
~4.5 s, yet the streams waited on the step's Forward until its connection timed out, 60 s after
the stop (2-core dev box). The router now ends the step's calls in flight when it finds the
target lost: the streams end UNAVAILABLE ("target lost ...") in seconds, and once the target
resumes the router serves again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from tests.helpers.rpc import BackgroundStream
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    ids_request,
    running_stack,
    tiny_model_dir_fixture,
    wait_serving,
)

pytestmark = pytest.mark.timeout(240)
PROMPT = list(range(1, 40))
ENDED_WITHIN_S = 20.0  # health checks: two misses of 2 s each, every 0.25 s; room for a busy box


def test_streams_end_soon_after_the_target_hangs(tmp_path: Path, tiny_model_dir: Path) -> None:
    with running_stack(tmp_path, tiny_model_dir) as (stack, router):
        expected = router.generate(ids_request(PROMPT, 16, False, ignore_eos=True)).token_ids
        long = ids_request(PROMPT, 4000, False, ignore_eos=True)
        streams = [BackgroundStream(router, long) for _ in range(4)]
        for stream in streams:
            stream.wait_for_tokens(8)
        pid = stack.target.started.pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            for stream in streams:
                stream.reader.join(ENDED_WITHIN_S * 3)
            ended_s = time.monotonic() - stopped
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_serving(router)
        after = router.generate(ids_request(PROMPT, 16, False, ignore_eos=True)).token_ids

    print(f"streams ended {ended_s:.1f} s after the target stopped")
    ends = [(e.code(), e.details()) for s in streams for e in s.errors if isinstance(e, grpc.Call)]
    assert len(ends) == len(streams), f"a stream outlived the hang? {ends}"
    assert all(
        code == grpc.StatusCode.UNAVAILABLE and "target lost" in why for code, why in ends
    ), ends
    assert ended_s < ENDED_WITHIN_S, f"the streams waited {ended_s:.0f} s for a hung target"
    assert after == expected
