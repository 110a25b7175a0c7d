"""An optional API key on the public API.

Clients send ``authorization: Bearer KEY`` (or ``x-api-key: KEY``) as call metadata. A call
without it, or with another key, ends UNAUTHENTICATED before the servicer sees it; the key is
compared in constant time and never logged. grpc.health.v1 stays open, so load balancers and
the launcher can probe a protected router.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

log = logging.getLogger("splitspec.router")
OPEN_SERVICES = ("/grpc.health.v1.Health/",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("API key (default: none)")
    group.add_argument(
        "--api-key-file", type=Path, default=None,
        help="file holding the key clients must send (surrounding whitespace ignored)",
    )
    group.add_argument(
        "--api-key-env", default=None, metavar="VAR",
        help="environment variable holding the key",
    )


def api_key_from_args(args: argparse.Namespace) -> bytes | None:
    if args.api_key_file is not None and args.api_key_env is not None:
        raise SystemExit("give --api-key-file or --api-key-env, not both")
    if args.api_key_file is not None:
        key = args.api_key_file.read_text().strip()
        source = f"file {args.api_key_file}"
    elif args.api_key_env is not None:
        key = os.environ.get(args.api_key_env, "").strip()
        source = f"${args.api_key_env}"
    else:
        return None
    if not key:
        raise SystemExit(f"the API key from {source} is empty")
    log.info("public API requires an API key (from %s)", source)  # where from, never the key
    return key.encode()


def presented_key(metadata: tuple | None) -> bytes | None:
    for name, value in metadata or ():
        if isinstance(value, bytes):
            continue
        if name == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip().encode()
        if name == "x-api-key":
            return value.strip().encode()
    return None


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _allowed(self, details: grpc.HandlerCallDetails) -> bool:
        if details.method.startswith(OPEN_SERVICES):
            return True
        given = presented_key(details.invocation_metadata)
        # compare_digest: the time taken does not depend on how much of the key matched.
        return given is not None and hmac.compare_digest(given, self._key)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or self._allowed(details):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that ends the call UNAUTHENTICATED."""
    message = "missing or invalid API key (send metadata 'authorization: Bearer <key>')"

    async def unary(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # makes this an async generator, as a server-streaming handler must be

    # The request stays unparsed bytes: an unauthenticated caller costs no parsing.
    de, ser = None, handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, de, ser)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(streaming, de, ser)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, de, ser)
    return grpc.stream_stream_rpc_method_handler(streaming, de, ser)


def interceptors(key: bytes | None) -> list[grpc.aio.ServerInterceptor]:
    """The public server's interceptors, outermost first: the key, then strict parsing."""
    from router.strict_parse import StrictParsing

    keyed: list[grpc.aio.ServerInterceptor] = [ApiKeyInterceptor(key)] if key else []
    return [*keyed, StrictParsing()]


def key_checker(key: bytes | None) -> Callable[[str | None], bool] | None:
    """The same key for the HTTP API: ``check(bearer_token_or_None)``, constant-time; None when
    no key is set (the HTTP server then lets every request in, as the gRPC API does)."""
    if key is None:
        return None

    def check(presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), key)

    return check
