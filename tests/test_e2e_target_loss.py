"""The target SIGKILLed mid-stream and restarted: streams end UNAVAILABLE at once (well within
their deadline), the router's health turns NOT_SERVING and refuses new work UNAVAILABLE (HTTP:
503), and once the target is back the same router serves again, with its radix cache dropped and
outputs as before. Then the router's graceful shutdown: SIGTERM drains running streams to their
end, refuses new ones, and exits 0. And, first (the shutdown ends the module's one stack), a
target that comes back with other settings: the router follows its pool size and multi-step cap,
and refuses to serve one whose limits no longer fit what it was built on
(router/target_contract.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc
from splitspec.launcher import LocalStack, free_ports
from tests.helpers.load import SteadyLoad
from tests.helpers.rpc import assert_slots_accounted
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(300)
DEADLINE_S = 30.0
DRAIN_TOKENS = 400  # the drain outlasts the probe below on a fast machine too
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STEPS = 4  # the target's --decode-steps: the settings test restarts it with others


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


def http_completion(stack: LocalStack, prompt: list[int]) -> tuple[int, dict]:
    """The HTTP API's status and error for a completion of ``prompt``."""
    body = json.dumps({"prompt": prompt, "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://{stack.http_address}/v1/completions", body,
                                     {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)["error"]


def http_health(stack: LocalStack) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://{stack.http_address}/health", timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def target_serving(stack: LocalStack) -> float:
    """The router's ``splitspec:target_serving`` gauge, from its /metrics."""
    with urllib.request.urlopen(f"http://{stack.http_address}/metrics", timeout=10) as reply:
        families = text_string_to_metric_families(reply.read().decode())
        (sample,) = next(f for f in families if f.name == "splitspec:target_serving").samples
    return sample.value


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[tuple[LocalStack, Router]]:
    """One stack for both tests (a start saved): a target of STEPS decode steps a Forward; the
    router logs a JSON line per request that ends (--log-requests), failures included."""
    log_dir = tmp_path_factory.mktemp("target-loss")
    target_args = ["--decode-steps", str(STEPS)]
    (http_port,) = free_ports(1, "127.0.0.1")
    router_args = ["--log-requests", "--log-format", "json", "--http-port", str(http_port)]
    with running_stack(log_dir, tiny_model_dir, target_args=target_args,
                       router_args=router_args) as (stack, router):  # fmt: skip
        stack.http_address = f"127.0.0.1:{http_port}"
        yield stack, router


def test_target_back_with_other_settings(pair: tuple[LocalStack, Router]) -> None:
    stack, router = pair
    prompts = random_prompts(seed=5, count=3, vocab_size=49152, max_len=30)
    short = [ids_request(p, 20, False, ignore_eos=True) for p in prompts]
    first_steps = router.status().decode_steps
    reference = [s.token_ids for s in router.generate_many(short)]
    context = router_model_info(stack.router_address).max_context_length
    command = list(stack.target.command)

    restart_target(stack, command + ["--decode-steps", "2", "--num-slots", "3000"])
    wait_for(lambda: router_health(stack.router_address) == SERVING, 30, "not serving")
    followed = router.status()
    again = [s.token_ids for s in router.generate_many(short)]

    restart_target(stack, command + ["--max-context", str(context // 2)])
    refusal = wait_for_refusal(router, short[0])
    unfit_health = router_health(stack.router_address)

    restart_target(stack, command)  # as the module's stack was: the next test uses it
    wait_for(lambda: router_health(stack.router_address) == SERVING, 30, "not serving")
    restored = router.status()
    last = [s.token_ids for s in router.generate_many(short)]

    assert first_steps == STEPS
    assert (followed.decode_steps, followed.num_total_slots) == (2, 3000)
    assert followed.num_free_slots == 3000 and again == reference
    assert refusal.code() == grpc.StatusCode.UNAVAILABLE
    assert "came back unfit" in refusal.details() and "max_context_length" in refusal.details()
    assert unfit_health != SERVING
    assert restored.decode_steps == STEPS and last == reference
    assert_slots_accounted(restored)


def test_target_loss_and_recovery(pair: tuple[LocalStack, Router]) -> None:
    """Last in the module: it ends with the router's shutdown."""
    stack, router = pair
    prompts = random_prompts(seed=3, count=6, vocab_size=49152, max_len=40)
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
    http_refusal = http_completion(stack, prompts[0])
    serving_while_down = target_serving(stack)
    health_while_down = http_health(stack)
    reason_while_down = router.status().unavailable_reason
    stack.target.start()
    stack.target.wait_healthy(120)
    back_after = wait_for(lambda: router_health(stack.router_address) == SERVING, 30,
                          "router did not serve again")
    status = router.status()
    serving_once_back = target_serving(stack)
    health_once_back = http_health(stack)
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
    assert http_refusal[0] == 503 and http_refusal[1]["type"] == "server_error", http_refusal
    assert "unavailable" in http_refusal[1]["message"]
    assert back_after < 30
    assert (serving_while_down, serving_once_back) == (0, 1)  # the /metrics gauge
    # /health said 200 "ok" throughout, so an HTTP load balancer kept sending requests
    assert health_while_down[0] == 503 and "unavailable" in health_while_down[1]["reason"]
    assert health_once_back == (200, {"status": "ok"})
    assert reason_while_down.startswith(f"target {stack.target.address} unavailable (")
    assert status.num_cached_tokens == 0 and status.num_free_slots == status.num_total_slots
    assert again == reference
    assert_slots_accounted(final)
    records, refused_while_draining, exit_code = drained
    assert all(not r.error and len(r.tokens) == DRAIN_TOKENS for r in records), records
    assert refused_while_draining.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in refused_while_draining.details()
    assert exit_code == 0
    # The request log saw each stream the target's loss ended, as a warning with the error.
    lines = [json.loads(line) for line in (stack.log_dir / "router.log").read_text().splitlines()]
    failed = [x for x in lines if x["logger"] == "splitspec.requests" and x["level"] == "warning"]
    assert len(failed) == len(long), failed
    assert all("target" in x["error"] and x["finish_reason"] == "abort" for x in failed), failed


def graceful_shutdown(stack, reqs) -> tuple[list, grpc.RpcError, int | None]:
    """SIGTERM to the router with streams running: they finish, new ones are refused, and the
    router exits 0 once drained."""
    reqs = [ids_request(list(r.input_ids.ids), DRAIN_TOKENS, False, ignore_eos=True)
            for r in reqs]
    load = SteadyLoad(stack.router_address, reqs, len(reqs)).start()
    wait_for(lambda: len(load.records) == len(reqs)
             and all(len(r.tokens) >= 4 for r in load.records), 60, "streams not going")
    stack.router.process.send_signal(signal.SIGTERM)
    # Probed once the router says it is draining, while its streams still run: a fixed pause
    # (0.2 s) outlasted the whole drain of 120-token streams on the H200 box's 16 cores, and
    # the probe met a closed port.
    wait_for(lambda: router_health(stack.router_address) == NOT_SERVING, 10, "not draining")
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


def restart_target(stack, command: list[str]) -> None:
    """SIGKILL the target, wait until the router has noticed, start it with ``command``."""
    stack.target.kill()
    wait_for(lambda: router_health(stack.router_address) != SERVING, 10, "still SERVING")
    stack.target.command = command  # argparse: the last value of a repeated flag wins
    stack.target.start()
    stack.target.wait_healthy(120)


def wait_for_refusal(router, request, timeout_s: float = 30.0) -> grpc.RpcError:
    """The router's refusal once it has checked the returned target (a plain "unavailable"
    until then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with pytest.raises(grpc.RpcError) as refused:
            router.generate(request, timeout_s=10)
        if "came back" in refused.value.details() or time.monotonic() > deadline:
            return refused.value
        time.sleep(0.1)


def router_model_info(address: str) -> pb.ModelInfo:
    with grpc.insecure_channel(address) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        return stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)

