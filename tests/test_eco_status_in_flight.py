"""GetServerStatus while a long speculative generation runs (real stack: target, EAGLE replica,
router): the speculation totals and generated tokens already count the running request, and
once it finishes they hold exactly what it reported, counted once."""

from __future__ import annotations

import threading
import time

import pytest

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.rpc import Stream

pytestmark = pytest.mark.slow
MAX_NEW = 160  # several seconds on the 2-core box: the status is polled meanwhile
POLL_S = 0.05


def long_request() -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.append(pb.ChatMessage(role="user", content="Tell a long story."))
    req.sampling.max_new_tokens = MAX_NEW
    req.sampling.temperature = 0.0
    req.sampling.ignore_eos = True
    req.speculation.enabled = True
    return req


def test_totals_count_a_request_while_it_runs_and_once_after(eco_stack: EcoStack) -> None:
    router = eco_stack.router
    before = router.wait_idle()
    result: list[Stream] = []
    worker = threading.Thread(target=lambda: result.append(router.generate(long_request())))
    worker.start()
    seen_running = None
    while worker.is_alive():
        status = router.status()
        grown = status.speculation.verify_steps > before.speculation.verify_steps
        if status.num_running and grown and seen_running is None:
            seen_running = status
        time.sleep(POLL_S)
    worker.join()
    assert seen_running is not None, "the running request's verify steps never showed"
    assert seen_running.num_generated_tokens > before.num_generated_tokens
    final = result[0].final.speculation
    after = router.wait_idle()
    for field in ("verify_steps", "draft_tokens", "accepted_tokens"):
        added = getattr(after.speculation, field) - getattr(before.speculation, field)
        assert added == getattr(final, field), field
    assert after.num_generated_tokens - before.num_generated_tokens == MAX_NEW
    assert after.num_finished_requests == before.num_finished_requests + 1
