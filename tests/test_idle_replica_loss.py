"""A draft replica that dies while idle leaves the router's status at once, and comes back.

Before, only a call found a dead replica out: one killed between requests read healthy in
GetServerStatus (and /metrics) until the next request met it. Now an idle replica in rotation
is health-checked every probe interval. Restarted on its port, it is back in rotation within
a second or two (the router's channel to it no longer backs off towards gRPC's two minutes), and
a request meanwhile runs target-only with the same output.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    oracle_head_dir_fixture,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)
PROMPT = list(range(1, 40))
# A probe interval is 1 s; the bound leaves room for a 2-core box running other tests.
NOTICE_S = 8.0


def replica(router: Router):
    (only,) = router.status().draft_replicas
    return only


def seconds_until(predicate, timeout_s: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            return float("inf")
        time.sleep(0.05)
    return time.monotonic() - start


def test_an_idle_replica_that_dies_leaves_the_status_and_comes_back(
    tmp_path: Path, tiny_model_dir: Path, oracle_head_dir: Path
) -> None:
    # The oracle head drafts the target's own tokens: speculation shows in every reply.
    eagle = ["--method", "eagle", "--eagle-head", str(oracle_head_dir)]
    with running_stack(tmp_path, tiny_model_dir, [eagle]) as (stack, router):
        before = router.generate(ids_request(PROMPT, 24, True, ignore_eos=True))
        assert before.final.speculation.accepted_tokens > 0, "the drafts were not used"
        assert replica(router).num_requests == 0

        stack.drafts[0].kill()
        noticed_s = seconds_until(lambda: not replica(router).healthy, NOTICE_S)
        error = replica(router).error
        down = router.generate(ids_request(PROMPT, 24, True, ignore_eos=True))

        stack.drafts[0].start()
        stack.drafts[0].wait_healthy(60)
        back_s = seconds_until(lambda: replica(router).healthy, NOTICE_S)
        after = router.generate(ids_request(PROMPT, 24, True, ignore_eos=True))

    print(f"idle replica killed: out of the status in {noticed_s:.2f} s; restarted: back in "
          f"{back_s:.2f} s")  # fmt: skip
    assert noticed_s < NOTICE_S, "a replica killed while idle still reads healthy"
    # Found by the router's own health checks, not by a request: the idle check, or the probe
    # of a replica suspected first ("suspected and not answering health checks": on a loaded
    # box in CI, most likely a call of the request before missed its deadline).
    assert "health check while idle" in error or "not answering health checks" in error, error
    assert down.token_ids == before.token_ids
    assert down.final.speculation.draft_tokens == 0, "drafts from a dead replica?"
    assert back_s < NOTICE_S, "the restarted replica was not taken back"
    assert after.token_ids == before.token_ids
    assert after.final.speculation.accepted_tokens > 0, "not speculating after the restart"
