"""The target SIGKILLed mid-stream and restarted: streams end UNAVAILABLE at once (well within
their deadline), the router's health turns NOT_SERVING and refuses new work UNAVAILABLE, and once
the target is back the same router serves again, with its radix cache dropped and outputs as
before. Then (same stack, to save a start-up) the router's graceful shutdown: SIGTERM drains
running streams to their end, refuses new ones, and exits 0."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import generation_pb2_grpc
from tests.helpers.load import SteadyLoad
from tests.helpers.rpc import assert_slots_accounted
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    ids_request,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(300)
DEADLINE_S = 30.0
DRAIN_TOKENS = 120
SERVING = health_pb2.HealthCheckResponse.SERVING


def router_health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                              timeout=2)
            return reply.status
        except grpc.RpcError:
            return -1


def wait_for(predicate, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(what)
        time.sleep(0.05)
    return time.monotonic() - start


def test_target_loss_and_recovery(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> None:
    prompts = random_prompts(seed=3, count=6, vocab_size=49152, max_len=40)
    log_dir = tmp_path_factory.mktemp("target-loss")
    with running_stack(log_dir, tiny_model_dir) as (stack, router):
        long = [ids_request(p, 1500, False, ignore_eos=True) for p in prompts]
        short = [ids_request(p, 24, False, ignore_eos=True) for p in prompts]
        reference = [s.token_ids for s in router.generate_many(short)]
        assert router.status().num_cached_tokens > 0  # there is a radix cache to drop later
        load = SteadyLoad(stack.router_address, long, len(long), timeout_s=DEADLINE_S).start()
        wait_for(lambda: len(load.records) == len(long)
                 and all(len(r.tokens) >= 8 for r in load.records), 60, "streams not going")
        killed_at = time.monotonic()
        stack.target.kill()
        records = load.stop(timeout_s=DEADLINE_S)
        ended_within = max(r.ended for r in records) - killed_at
        down_after = wait_for(lambda: router_health(stack.router_address) != SERVING, 10,
                              "router health still SERVING")
        with pytest.raises(grpc.RpcError) as refused:
            router.generate(short[0], timeout_s=10)
        stack.target.start()
        stack.target.wait_healthy(120)
        back_after = wait_for(lambda: router_health(stack.router_address) == SERVING, 30,
                              "router did not serve again")
        status = router.status()
        again = [s.token_ids for s in router.generate_many(short)]
        final = router.status()
        drained = graceful_shutdown(stack, long[:3])

    for r in records:
        assert r.done and r.error.startswith("UNAVAILABLE"), r.error
        assert "target" in r.error
        assert len(r.tokens) < 1500
    assert ended_within < 5.0
    assert down_after < 5.0
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    assert "unavailable" in refused.value.details()
    assert back_after < 30
    assert status.num_cached_tokens == 0 and status.num_free_slots == status.num_total_slots
    assert again == reference
    assert_slots_accounted(final)
    records, refused_while_draining, exit_code = drained
    assert all(not r.error and len(r.tokens) == DRAIN_TOKENS for r in records), records
    assert refused_while_draining.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in refused_while_draining.details()
    assert exit_code == 0


def graceful_shutdown(stack, reqs) -> tuple[list, grpc.RpcError, int | None]:
    """SIGTERM to the router with streams running: they finish, new ones are refused, and the
    router exits 0 once drained."""
    reqs = [ids_request(list(r.input_ids.ids), DRAIN_TOKENS, False, ignore_eos=True)
            for r in reqs]
    load = SteadyLoad(stack.router_address, reqs, len(reqs)).start()
    wait_for(lambda: len(load.records) == len(reqs)
             and all(len(r.tokens) >= 4 for r in load.records), 60, "streams not going")
    stack.router.process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    with grpc.insecure_channel(stack.router_address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(reqs[0], timeout=10))
    records = load.stop(60)
    try:
        code = stack.router.process.wait(30)
    except subprocess.TimeoutExpired:
        code = None
    return records, refused.value, code
