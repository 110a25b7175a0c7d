"""A dead and a hung draft replica under steady load: no request fails, no output changes, and
the hung one never stalls the target.

Two EAGLE replicas (the oracle head, so drafts get accepted) serve a steady load of the issue's 50
concurrent greedy streams (the router runs and speculates for all 50 at once). Replica A is
SIGKILLed and restarted; then replica B is SIGSTOPped for 12 s and SIGCONTinued. Every stream must
finish with exactly its target-only output (speculation is lossless, so target-only greedy is the
fault-free reference), and no step while B is stopped may take longer than the deadline the router
gave B plus two steady steps (B's Propose deadline is twice its recent p99, so the one step that
misses it costs that plus its verify; a suspected replica is not waited for again). Waiting for B
would show as a step of the whole stop. The stop is long because that missed deadline grows with
load: on a loaded CI box (median step 1.56 s) one step took 4.6 s, past half of the 8 s stop this
test had then.

To fit CI (2 shared cores, the whole stack) the streams are short (32 tokens) and the load
cycles over 50 distinct prompts, so the reference is one batch of 50 target-only streams.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from splitspec.launcher import LocalStack
from tests.helpers.load import SteadyLoad, median, step_gaps
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    oracle_head_dir_fixture,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(300)
CONCURRENCY = 50
MAX_NEW = 32
STOP_S = 12.0


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def both_replicas_busy(router: Router) -> bool:
    replicas = router.status().draft_replicas
    return all(r.healthy and r.num_requests > 0 for r in replicas)


def inject_faults(stack: LocalStack, router: Router) -> tuple[float, float]:
    """SIGKILL + restart of replica A, then SIGSTOP of B for STOP_S; returns B's stop window."""
    wait_for(lambda: both_replicas_busy(router), 60, "load not spread over both replicas")
    stack.drafts[0].kill()
    time.sleep(1.0)
    stack.drafts[0].start()
    stack.wait_drafts_serving(90)
    wait_for(lambda: both_replicas_busy(router), 60, "restarted replica got no requests")
    time.sleep(3.0)  # steady steps again: the baseline of the step-time check
    pid = stack.drafts[1].process.pid
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(STOP_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    return stopped_at, time.monotonic()


def test_killed_and_hung_replicas_fail_nothing_and_stall_nothing(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, oracle_head_dir: Path
) -> None:
    eagle = ["--method", "eagle", "--eagle-head", str(oracle_head_dir), "--threads", "1"]
    prompts = random_prompts(seed=5, count=CONCURRENCY, vocab_size=49152, max_len=48)
    # More requests than the faults take (stopping the load lets running streams end).
    spec = [ids_request(prompts[i % len(prompts)], MAX_NEW, True, ignore_eos=True)
            for i in range(800)]
    log_dir = tmp_path_factory.mktemp("draft-faults")
    # All 50 run and speculate together (the default speculative batch is 32).
    router_args = ["--max-running", str(CONCURRENCY),
                   "--max-speculative-batch", str(CONCURRENCY)]
    with running_stack(log_dir, tiny_model_dir, [eagle, eagle], router_args=router_args) as (
        stack, router,
    ):
        load = SteadyLoad(stack.router_address, spec, CONCURRENCY).start()
        try:
            stopped_at, resumed_at = inject_faults(stack, router)
            time.sleep(1.0)
            # Two generations of streams at least (a loaded CI box once fitted only 96 in the
            # faults' fixed time): waited for, not hoped for.
            wait_for(lambda: len(load.records) >= 2 * CONCURRENCY, 60, "load stalled")
        finally:
            records = load.stop()
        stack.wait_drafts_serving(60)  # B is re-admitted after it resumed
        plain = [ids_request(p, MAX_NEW, False, ignore_eos=True) for p in prompts]
        reference = [s.token_ids for s in router.generate_many(plain)]
        status = router.status()
        b_deadlines = missed_deadlines_s(log_dir / "router.log", stack.drafts[1].address)

    failed = [r for r in records if r.error or not r.done]
    assert not failed, f"{len(failed)} of {len(records)} failed: {failed[0].error}"
    changed = [r.prompt_index for r in records
               if r.tokens != reference[r.prompt_index % len(prompts)]]
    assert not changed, f"outputs changed for prompts {changed}"
    assert len(records) >= 2 * CONCURRENCY
    before = step_gaps(records, stopped_at - 2.0, stopped_at)
    during = step_gaps(records, stopped_at, resumed_at)
    base = median(before)
    worst = max(during)
    print(f"steps: {len(before)} before, median {base * 1e3:.1f} ms; {len(during)} while "
          f"stopped, worst {worst * 1e3:.1f} ms; {len(records)} streams")
    assert len(before) > 20 and len(during) > 20, (len(before), len(during))
    # Not a multiple of the median: the missed deadline is 2x a p99 that load stretches (on the
    # loaded CI box 3.4x and 5.3x the median, 1.25 and 1.99 s, against 2.8x on an idle one; on
    # 2026-12-07 a step of 8.07 s over a median of 1.67 s). So the worst step is held to what
    # the router's own log says it waited for B (its largest missed deadline) plus a steady
    # step before and one after, and that wait to less than the stop: waiting for B would take
    # the whole stop.
    assert b_deadlines, "B was stopped with requests but never missed a deadline"
    assert max(b_deadlines) < STOP_S, f"B's deadlines (s): {b_deadlines}"
    assert worst <= max(b_deadlines) + 2 * base + 0.5, (
        f"a step took {worst * 1e3:.0f} ms while B was stopped for {STOP_S:.0f} s (median "
        f"step before {base * 1e3:.0f} ms, B's longest missed deadline "
        f"{max(b_deadlines) * 1e3:.0f} ms): the router waited for the stopped replica"
    )
    assert all(r.healthy for r in status.draft_replicas)
    assert status.speculation.accepted_tokens > 0


def missed_deadlines_s(router_log: Path, address: str) -> list[float]:
    """The deadlines (s) the router says ``address`` missed: its log line (router/draft_pool.py)
    reads "draft replica ADDRESS missed a Propose (1234 ms) deadline; skipped"."""
    pattern = re.compile(rf"draft replica {re.escape(address)} missed a \w+ \((\d+) ms")
    return [int(m.group(1)) / 1e3 for m in pattern.finditer(router_log.read_text())]
