"""Errors as the OpenAI API returns them: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from router.errors import DuplicateRequest, InvalidRequest, Overloaded, ServiceFailure

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def from_router_error(err: Exception, params: Mapping[str, str] | None = None) -> ApiError:
    """The HTTP twin of the gRPC status the public servicer gives the same error. ``params``:
    the body's names of request fields named otherwise (max_new_tokens: max_tokens), so that
    a 400's ``param`` is the key the client sent, and so is a message's leading field name."""
    if isinstance(err, InvalidRequest):
        param = err.field and (params or {}).get(err.field, err.field)
        message = str(err)
        if err.field and param and message.startswith(f"{err.field} "):
            message = param + message[len(err.field) :]  # "max_tokens must be ...", as sent
        return ApiError(400, message, param, code="invalid_value")
    if isinstance(err, Overloaded):
        return ApiError(429, str(err), code="overloaded")
    if isinstance(err, DuplicateRequest):
        return ApiError(409, str(err), code="duplicate_request")
    if isinstance(err, ServiceFailure):
        return ApiError(503, str(err), code="service_unavailable")
    return ApiError(500, f"internal error: {err}", code="internal_error")
