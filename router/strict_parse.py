"""Requests that do not parse end INVALID_ARGUMENT with a message, not INTERNAL.

gRPC's own deserialization failure (a field of the wrong wire type, invalid UTF-8 in a
string) answers a generic error. This interceptor parses the bytes with the method's own
deserializer and says what was wrong: unary methods take the raw bytes, streaming ones get an
``Unparsable`` in place of the request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

PUBLIC_PREFIX = "/splitspec.v1.Generation/"  # health and reflection keep their own handling


class StrictParsing(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if (
            handler is None
            or handler.request_deserializer is None
            or not details.method.startswith(PUBLIC_PREFIX)
        ):
            return handler
        if handler.unary_unary:
            return _unary(handler)
        if handler.unary_stream:
            return _streaming(handler)
        return handler  # the public API has no client-streaming methods


async def _parse(handler: grpc.RpcMethodHandler, raw: bytes, context):
    try:
        return handler.request_deserializer(raw)
    except (DecodeError, UnicodeDecodeError, ValueError) as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _message(err))


def _message(err: Exception) -> str:
    return (
        f"the request does not parse ({err.__class__.__name__}: {err}); "
        "strings must be valid UTF-8 and fields of their declared types"
    )


def _unary(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def behavior(raw: bytes, context):
        request = await _parse(handler, raw, context)
        return await handler.unary_unary(request, context)

    return grpc.unary_unary_rpc_method_handler(behavior, None, handler.response_serializer)


class Unparsable:
    """What a streaming handler receives for bytes that do not parse: the servicer answers
    INVALID_ARGUMENT with ``message``. (Streaming handlers keep their own behavior, so that
    cancellation reaches the servicer's generator exactly as without this interceptor.)"""

    def __init__(self, message: str) -> None:
        self.message = message


def _safe(deserializer):
    def parse(raw: bytes):
        try:
            return deserializer(raw)
        except (DecodeError, UnicodeDecodeError, ValueError) as err:
            return Unparsable(_message(err))

    return parse


def _streaming(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    return grpc.unary_stream_rpc_method_handler(
        handler.unary_stream, _safe(handler.request_deserializer), handler.response_serializer
    )
