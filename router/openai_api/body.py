"""An HTTP request's body, read up to a limit: Starlette reads any body whole, so a client could
make the router hold gigabytes before the request's own limits (its characters, its tokens)
were ever checked. gRPC bounds its messages the same way (``--max-request-bytes``)."""

from __future__ import annotations

from starlette.requests import Request as HttpRequest

from router.openai_api.errors import ApiError

DEFAULT_MAX_BODY_BYTES = 8 << 20  # JSON escapes a character in up to 12 bytes: room to spare


async def read_body(request: HttpRequest, limit: int) -> bytes:
    """The whole body; 413 past ``limit`` bytes, said from Content-Length before reading."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body has {size:,} bytes or more, past the router's limit of {limit:,} "
        "(--max-http-body-bytes)",
        code="request_too_large",
    )
