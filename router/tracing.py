"""OpenTelemetry tracing of requests: `--otlp-traces-endpoint` (vLLM's flag; TGI's is
`--otlp-endpoint`) exports a span per request over OTLP/gRPC (router/request_spans.py).

Off by default, and then nothing of OpenTelemetry is imported: the SDK and the exporter load
inside ``start``. Spans leave in batches from the SDK's own thread, and a full queue or an
unreachable collector drops them: the scheduler never waits on a collector.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from router import telemetry
from router.config import RouterConfig

log = logging.getLogger("splitspec.router")
# One export's deadline, retries included (the SDK's default: 10 s); the last export, at stop,
# holds the router's exit this long at most when the collector is down.
EXPORT_TIMEOUT_S = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tracing")
    group.add_argument(
        "--otlp-traces-endpoint", default="", metavar="HOST:PORT",
        help="OTLP/gRPC collector that receives a span per finished request (its queue time, "
        "tokens, speculation; a client's W3C traceparent continues its trace); https://... "
        "for TLS; empty (default): no tracing",
    )  # fmt: skip
    group.add_argument("--otlp-service-name", default="splitspec-router",
                       help="service.name of the router's spans")  # fmt: skip


class Tracing:
    """The SDK's span pipeline while the router runs; ``stop`` sends what is still queued."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider  # opentelemetry.sdk.trace.TracerProvider

    def stop(self) -> None:
        self.provider.shutdown()


def start(config: RouterConfig, model_name: str) -> Tracing | None:
    """With an endpoint, installs the observer that turns finished requests into spans."""
    if not config.otlp_traces_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from router.request_spans import RequestSpans

    endpoint = config.otlp_traces_endpoint
    exporter = OTLPSpanExporter(
        endpoint=endpoint, insecure=not endpoint.startswith("https://"), timeout=EXPORT_TIMEOUT_S
    )
    # A provider of our own, not the global one: nothing else in the process emits spans.
    provider = TracerProvider(resource=Resource.create({"service.name": config.otlp_service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    telemetry.install(RequestSpans(provider.get_tracer("splitspec.router"), model_name))
    log.info("tracing: a span per request to %s as %s", endpoint, config.otlp_service_name)
    return Tracing(provider)
