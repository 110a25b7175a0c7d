"""Integration checks run inside the compose network (the `tester` service), one phase per run.

tests/test_compose.py drives the stack from outside (scales drafts, kills a container) and runs
these phases in between; each prints one JSON line and exits 1 on a failed check.

  wait-drafts N       until the router serves with exactly N healthy drafts, all from DNS
  greedy-equality     greedy speculative outputs equal target-only ones, drafts accepted
  spread              concurrent requests land on every healthy draft replica
  kill-streams N      N concurrent greedy streams; prints STREAMS-RUNNING once all stream (the
                      driver then kills a draft); every stream must end normally, equal to
                      its target-only twin
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc

from protos import generation_pb2 as pb
from protos import generation_pb2_grpc

ROUTER = os.environ.get("ROUTER", "router:50051")
ROUTER_HTTP = os.environ.get("ROUTER_HTTP", "router:8000")
DRAFT_DNS = os.environ.get("DRAFT_DNS", "draft:50071")
VOCAB = 49152
MAX_NEW = 32
# Reconnect at once, not after gRPC's growing backoff (up to 120 s): a name that did not resolve
# while the network's DNS was being updated (a container stopped or started just before this
# phase) would otherwise hold every call UNAVAILABLE for half a minute and more.
RECONNECT = [(f"grpc.{k}_reconnect_backoff_ms", 250) for k in ("initial", "min", "max")]
stub = generation_pb2_grpc.GenerationStub(grpc.insecure_channel(ROUTER, options=RECONNECT))


def status() -> pb.ServerStatus:
    return stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=10)


def prompts(count: int, seed: int) -> list[list[int]]:
    """Random ids with a repeated phrase in each, so an n-gram drafter finds matches."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        phrase = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 8))]
        noise = [rng.randrange(VOCAB) for _ in range(rng.randint(5, 40))]
        out.append(noise + phrase * rng.randint(3, 6))
    return out


def request(ids: list[int], speculate: bool) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.input_ids.ids.extend(ids)
    req.sampling.max_new_tokens = MAX_NEW
    req.sampling.temperature = 0.0
    req.sampling.ignore_eos = True
    req.speculation.enabled = speculate
    return req


def generate(req: pb.GenerateRequest, started: threading.Event | None = None) -> list[int]:
    tokens: list[int] = []
    last = None
    for item in stub.Generate(req, timeout=300):
        tokens.extend(item.token_ids)
        last = item
        if started is not None and tokens:
            started.set()
    assert last is not None and last.finish_reason == pb.FINISH_REASON_LENGTH, last
    return tokens


def generate_all(reqs: list[pb.GenerateRequest], started=None) -> list[list[int]]:
    with ThreadPoolExecutor(len(reqs)) as pool:
        events = started or [None] * len(reqs)
        return list(pool.map(generate, reqs, events))


def healthy() -> list[str]:
    return sorted(r.address for r in status().draft_replicas if r.healthy)


def wait_drafts(count: int, timeout_s: float = 240) -> dict:
    """Also waits for the router itself: it serves once the target has loaded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            s = status()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.5)
            continue
        found = [d for d in s.draft_discovery if d.name == DRAFT_DNS]
        ready = sorted(r.address for r in s.draft_replicas if r.healthy)
        if found and len(found[0].addresses) == count and len(ready) == count:
            assert all(r.source == DRAFT_DNS for r in s.draft_replicas if r.healthy)
            return {"healthy": ready, "resolved_at": found[0].last_resolved_unix_s}
        time.sleep(0.2)
    raise AssertionError(f"not {count} healthy drafts after {timeout_s} s: {status()}")


def greedy_equality() -> dict:
    ps = prompts(4, seed=1)
    before = status().speculation
    spec = generate_all([request(p, True) for p in ps])
    plain = generate_all([request(p, False) for p in ps])
    after = status().speculation
    assert spec == plain, "speculative output differs from target-only"
    assert after.verify_steps > before.verify_steps, "no speculation happened"
    accepted = after.accepted_tokens - before.accepted_tokens
    assert accepted > 0, "no draft token accepted"
    assert http_completion(ps[0]) == text_of(request(ps[0], True)), "HTTP differs from gRPC"
    return {"prompts": len(ps), "accepted_tokens": accepted}


def http_completion(ids: list[int]) -> str:
    """The OpenAI-compatible API's greedy completion of ``ids`` (the router's HTTP port)."""
    body = {"prompt": ids, "max_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    call = urllib.request.Request(
        f"http://{ROUTER_HTTP}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(call, timeout=300) as reply:
        choice = json.loads(reply.read())["choices"][0]
    assert choice["finish_reason"] == "length", choice
    return choice["text"]


def text_of(req: pb.GenerateRequest) -> str:
    return "".join(item.text for item in stub.Generate(req, timeout=300))


def spread() -> dict:
    """Every healthy replica holds requests while a batch runs (least-loaded assignment)."""
    replicas = healthy()
    seen: set[str] = set()
    reqs = [request(p, True) for p in prompts(4 * len(replicas), seed=2)]
    with ThreadPoolExecutor(1) as pool:
        batch = pool.submit(generate_all, reqs)
        while not batch.done():
            seen |= {r.address for r in status().draft_replicas if r.num_requests > 0}
            time.sleep(0.05)
        batch.result()
    assert seen >= set(replicas), f"replicas {set(replicas) - seen} got no request"
    return {"replicas": replicas, "held_requests": sorted(seen)}


def kill_streams(count: int) -> dict:
    ps = prompts(count, seed=3)
    plain = generate_all([request(p, False) for p in ps])
    started = [threading.Event() for _ in ps]
    with ThreadPoolExecutor(1) as pool:
        spec = pool.submit(generate_all, [request(p, True) for p in ps], started)
        for event in started:
            assert event.wait(120), "a stream never started"
        print("STREAMS-RUNNING", flush=True)  # the driver kills a draft container now
        outputs = spec.result()
    assert outputs == plain, "an output changed across the kill"
    return {"streams": count, "healthy_at_end": healthy()}  # the driver waits for the drop


def main() -> int:
    phase, *args = sys.argv[1:]
    try:
        if phase == "wait-drafts":
            result = wait_drafts(int(args[0]))
        elif phase == "greedy-equality":
            result = greedy_equality()
        elif phase == "spread":
            result = spread()
        elif phase == "kill-streams":
            result = kill_streams(int(args[0]))
        else:
            raise SystemExit(f"unknown phase {phase}")
    except (AssertionError, grpc.RpcError) as err:
        print(json.dumps({"phase": phase, "ok": False, "error": str(err)[:2000]}), flush=True)
        return 1
    print(json.dumps({"phase": phase, "ok": True, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
