"""Starts the router's HTTP side in its own event loop: the OpenAI API and /metrics.

``--http-port`` turns it on (0, the default: off). The Prometheus observer is installed
whatever the port, so gRPC-only routers keep counting too; without HTTP nobody scrapes them.
A router whose public gRPC port serves TLS serves HTTPS with the same certificate (and asks
for client certificates where gRPC does): the API key must not cross the network in the clear.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn

from plumbing.arg_types import POSITIVE_INT, port
from plumbing.security import ServerTLS
from router import telemetry
from router.metrics import RouterMetrics
from router.openai_api.app import KeyChecker, OpenAIServer
from router.openai_api.body import DEFAULT_MAX_BODY_BYTES

log = logging.getLogger("splitspec.router")


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HTTP API and metrics")
    group.add_argument(
        "--http-port",
        type=port,
        default=0,
        help="port of the OpenAI-compatible HTTP API and /metrics on --host (0: off); "
        "HTTPS with --tls-cert and --tls-key",
    )
    group.add_argument(
        "--max-http-body-bytes",
        type=POSITIVE_INT,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest HTTP request body; a larger one is refused 413 before it is read whole",
    )
    group.add_argument(
        "--served-model-name",
        default="",
        help="model name the HTTP API answers to (default: the target's model name)",
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside the router's loop: the router, not uvicorn, owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def start_http(
    servicer: Any,
    host: str,
    port: int,
    model_name: str,
    key_checker: KeyChecker | None = None,
    tls: ServerTLS | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> set[asyncio.Task]:
    """Installs the metrics observer; with a port, starts serving. Returns the tasks to await
    beside the gRPC server's (a failed bind ends the router, as a gRPC one does)."""
    metrics = RouterMetrics(model_name, servicer.scheduler)
    telemetry.install(metrics)
    if not port:
        return set()
    app = OpenAIServer(servicer, model_name, metrics.registry, key_checker, max_body_bytes).app()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
        **_ssl_options(tls),
    )
    scheme = "HTTPS" if tls else "HTTP"
    log.info("router %s (OpenAI API, /metrics) on %s:%d", scheme, host, port)
    return {asyncio.create_task(_EmbeddedServer(config).serve())}


def _ssl_options(tls: ServerTLS | None) -> dict[str, Any]:
    """uvicorn's TLS settings for the public port's certificate (none: plain HTTP)."""
    if tls is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.client_ca is not None:
        options.update(ssl_ca_certs=str(tls.client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options
