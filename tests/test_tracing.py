"""Tracing (router/tracing.py, router/request_spans.py): a router with --otlp-traces-endpoint
sends a span per request to an OTLP/gRPC collector, a real one started here in the test's
process; a client's traceparent (and tracestate) continues into it; a collector that is down
costs no request."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from router.request_spans import WallClock
from splitspec.launcher import free_port
from splitspec.serve_cli import _local_stack
from splitspec.serve_flags import add_serve_flags
from tests.helpers.rpc import Stream
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    ids_request,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)
REPO_ROOT = Path(__file__).resolve().parents[1]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"
HTTP_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
HTTP_TRACEPARENT = f"00-{HTTP_TRACE_ID}-b7ad6b7169203331-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"  # W3C's own example: two vendors' entries
PROMPT = [5, 6, 7, 8, 9] * 4  # repeats: the n-gram drafter proposes, so rounds verify


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, with its resource's attributes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[dict[str, Any], trace_pb2.Span]] = []

    def Export(self, request, context):  # noqa: N802 (gRPC naming)
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope in resource_spans.scope_spans:
                    self.spans += [(resource, span) for span in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.contextmanager
def running_collector() -> Iterator[tuple[Collector, int]]:
    collector = Collector()
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield collector, port
    finally:
        server.stop(grace=None)


def attributes(pairs: Any) -> dict[str, Any]:
    """OTLP KeyValues as a dict (arrays of strings as tuples)."""
    values: dict[str, Any] = {}
    for kv in pairs:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        if kind == "array_value":
            value = tuple(v.string_value for v in value.values)
        values[kv.key] = value
    return values


def generate(router: Any, request_id: str, metadata: tuple = ()) -> Stream:
    stream = Stream()
    request = ids_request(PROMPT, 12, True, request_id=request_id)
    stream.items += router.stub.Generate(request, timeout=120, metadata=metadata)
    return stream


def complete_over_http(http_port: int) -> dict[str, Any]:
    body = json.dumps({"prompt": "Hello there", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/v1/completions", body,
        {"content-type": "application/json", "traceparent": HTTP_TRACEPARENT,
         "tracestate": TRACESTATE},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def cancel_after_first_item(router: Any, request_id: str) -> None:
    request = ids_request(PROMPT, 1500, False, request_id=request_id, ignore_eos=True)
    call = router.stub.Generate(request, timeout=120)
    next(call)
    call.cancel()


def test_a_span_per_request_continues_the_clients_trace(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    drafts = [["--method", "ngram"]]
    with running_collector() as (collector, port):
        http_port = free_port()
        router_args = ["--otlp-traces-endpoint", f"127.0.0.1:{port}", "--http-port",
                       str(http_port), "--otlp-service-name", "router-under-test"]  # fmt: skip
        started_ns = time.time_ns()
        # The spans leave when the stack stops at the end of the `with` (the flush at shutdown;
        # the SDK's own schedule, every 5 s, has not come yet).
        with running_stack(tmp_path, tiny_model_dir, drafts, (), router_args) as (_, router):
            traced = generate(
                router, "traced-1", (("traceparent", TRACEPARENT), ("tracestate", TRACESTATE))
            )
            fresh = generate(router, "fresh-1")
            cancel_after_first_item(router, "cancelled-1")
            completion = complete_over_http(http_port)
        ended_ns = time.time_ns()
    spans = [span for _, span in collector.spans]
    assert {resource["service.name"] for resource, _ in collector.spans} == {"router-under-test"}
    by_request = {
        attributes(s.attributes)["splitspec.request_id"]: s
        for s in spans
        if s.name == "splitspec.generate"
    }
    assert {"traced-1", "fresh-1", "cancelled-1"} < set(by_request) and len(by_request) == 4

    span = by_request["traced-1"]
    assert span.kind == trace_pb2.Span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == CLIENT_SPAN_ID
    assert span.trace_state == TRACESTATE  # the client's vendor entries carried on
    fields = attributes(span.attributes)
    assert fields["gen_ai.usage.output_tokens"] == len(traced.token_ids) == 12
    assert fields["gen_ai.usage.input_tokens"] == traced.final.usage.prompt_tokens == len(PROMPT)
    assert fields["gen_ai.response.finish_reasons"] == ("length",)
    assert fields["splitspec.verify_steps"] == traced.final.speculation.verify_steps > 0
    assert fields["splitspec.accepted_tokens"] == traced.final.speculation.accepted_tokens
    duration_ns = span.end_time_unix_nano - span.start_time_unix_nano
    assert 0 < fields["splitspec.ttft_ms"] * 1e6 <= duration_ns
    assert started_ns < span.start_time_unix_nano < span.end_time_unix_nano < ended_ns
    assert span.status.code == trace_pb2.Status.STATUS_CODE_UNSET

    children = {s.name: s for s in spans if s.parent_span_id == span.span_id}
    assert set(children) == {"queue", "prefill", "decode"}
    assert all(c.trace_id == span.trace_id for c in children.values())
    assert children["queue"].start_time_unix_nano == span.start_time_unix_nano
    assert children["decode"].end_time_unix_nano == span.end_time_unix_nano

    other = by_request["fresh-1"]
    assert other.trace_id.hex() != TRACE_ID and not other.parent_span_id
    assert attributes(other.attributes)["gen_ai.usage.output_tokens"] == len(fresh.token_ids)

    over_http = [s for s in by_request.values() if s.trace_id.hex() == HTTP_TRACE_ID]
    assert len(over_http) == 1  # the HTTP API's traceparent header continues too
    assert over_http[0].trace_state == TRACESTATE
    output_tokens = attributes(over_http[0].attributes)["gen_ai.usage.output_tokens"]
    assert output_tokens == completion["usage"]["completion_tokens"]

    cancelled = by_request["cancelled-1"]
    assert cancelled.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert attributes(cancelled.attributes)["gen_ai.response.finish_reasons"] == ("abort",)


def test_a_router_whose_collector_is_down_still_serves(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    router_args = ["--otlp-traces-endpoint", f"127.0.0.1:{free_port()}"]  # nothing listens
    with running_stack(tmp_path, tiny_model_dir, (), (), router_args) as (stack, router):
        stream = generate(router, "untraced-1")
        assert len(stream.token_ids) == 12 and stream.final.usage.prompt_tokens == len(PROMPT)
    # The last flush gives up in time: the router exits by itself, not killed by stop().
    assert stack.router.process is not None and stack.router.process.returncode == 0


def test_wall_clock_keeps_perf_counter_intervals() -> None:
    clock = WallClock.now()
    now = time.perf_counter()
    assert abs(clock.ns(now) - time.time_ns()) < 50_000_000  # the same instant, within 50 ms
    assert clock.ns(now + 1.5) - clock.ns(now) == 1_500_000_000


def test_a_router_without_tracing_imports_no_opentelemetry() -> None:
    probe = "import json, sys, router.server; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=120, check=True,
    )  # fmt: skip
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert not [m for m in loaded if m.startswith("opentelemetry")]


def test_splitspec_serve_passes_the_tracing_flags_to_its_router() -> None:
    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    flags = ["--otlp-traces-endpoint", "collector:4317", "--otlp-service-name", "edge"]
    stack = _local_stack(parser.parse_args(flags))  # built, not started
    if stack.log_dir is not None:
        shutil.rmtree(stack.log_dir)
    command = " ".join(stack.router.command)
    assert "--otlp-traces-endpoint collector:4317 --otlp-service-name edge" in command
