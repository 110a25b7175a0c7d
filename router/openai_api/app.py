"""The ASGI app: OpenAI endpoints, /health and /metrics over the router's own scheduler.

It runs in the router's event loop (router.http_server), so a request here is submitted to
the same scheduler, validated by the same code and batched with the gRPC API's requests.
A generation is authorized and parsed here, then run by router/openai_api/generation.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from router import telemetry
from router.openai_api import protocol, tokenize
from router.openai_api.body import DEFAULT_MAX_BODY_BYTES, read_body
from router.openai_api.errors import ApiError, error_response
from router.openai_api.generation import ChoiceRunner
from router.request import TRACE_HEADERS

# Given the bearer token (None when the header is missing), says whether it may call /v1/*.
KeyChecker = Callable[[str | None], bool]


class OpenAIServer:
    def __init__(
        self,
        servicer: Any,  # router.servicer.GenerationServicer: builds and validates requests
        model_name: str,
        registry: Any = None,  # prometheus_client registry served at /metrics
        key_checker: KeyChecker | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.servicer = servicer
        self.max_body_bytes = max_body_bytes
        self.scheduler = servicer.scheduler
        self.model_name = model_name
        self.registry = registry
        self.key_checker = key_checker
        self.created = int(time.time())
        self.choices = ChoiceRunner(servicer, model_name)

    def app(self) -> Starlette:
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            # :path, as a served name may hold a slash (the openai client sends it as %2F)
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/tokenizer_info", self.tokenizer_info, methods=["GET"]),
        ]
        if self.registry is not None:
            routes.append(Route("/metrics", self.metrics, methods=["GET"]))
        return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})

    # ---- endpoints ---------------------------------------------------------------------------

    async def health(self, request: HttpRequest) -> Response:
        """200 while the router serves; 503 with the reason while it refuses requests (the
        target lost or taken by another router, a shutdown), as its gRPC health says
        NOT_SERVING: a load balancer probing this stops sending it requests."""
        reason = self.scheduler.target_unavailable
        if reason:
            return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(self, request: HttpRequest) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def models(self, request: HttpRequest) -> Response:
        try:
            self._authorize(request)
        except ApiError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: HttpRequest) -> Response:
        """OpenAI's retrieve: the served model's card, as listed; another id is a 404."""
        try:
            self._authorize(request)
            self._check_model(request.path_params["model_id"])
        except ApiError as err:
            return error_response(err)
        return JSONResponse(self._card())

    def _card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "splitspec",
            "max_model_len": self.servicer.model_info.max_context_length,
        }

    # vLLM's tokenizer endpoints (router/openai_api/tokenize.py), authorized as /v1/* is.

    async def tokenize(self, request: HttpRequest) -> Response:
        max_len = self.servicer.model_info.max_context_length
        return await self._answer(request, lambda body: tokenize.tokenize(
            self._for_this_model(body), self.scheduler.tokenizer, max_len))  # fmt: skip

    async def detokenize(self, request: HttpRequest) -> Response:
        return await self._answer(request, lambda body: tokenize.detokenize(
            self._for_this_model(body), self.scheduler.tokenizer))  # fmt: skip

    def _for_this_model(self, raw: bytes) -> dict[str, Any]:
        """The parsed body, unless it names another model (404, as a generation's would)."""
        body = protocol.parse_body(raw)
        self._check_model(body.get("model"))
        return body

    def _check_model(self, model: Any) -> None:
        if model is not None and model != self.model_name:
            raise ApiError(404, f"The model `{model}` does not exist; this server "
                           f"serves `{self.model_name}`", "model", "model_not_found")  # fmt: skip

    async def tokenizer_info(self, request: HttpRequest) -> Response:
        max_len = self.servicer.model_info.max_context_length
        return await self._answer(request, lambda _: tokenize.tokenizer_info(
            self.scheduler.tokenizer, max_len))  # fmt: skip

    async def _answer(self, request: HttpRequest, answer: Callable[[bytes], dict]) -> Response:
        try:
            self._authorize(request)
            return JSONResponse(answer(await read_body(request, self.max_body_bytes)))
        except ApiError as err:
            return error_response(err)

    async def chat(self, request: HttpRequest) -> Response:
        return await self._generate(request, protocol.parse_chat, chat=True)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._generate(request, protocol.parse_completion, chat=False)

    # ---- generation: authorized and parsed here, run by ChoiceRunner -------------------------

    async def _generate(self, request: HttpRequest, parse: Callable, chat: bool) -> Response:
        try:
            self._authorize(request)
            parsed = parse(protocol.parse_body(await read_body(request, self.max_body_bytes)))
            self._check_model(parsed.model)
            trace_context = {k: v for k in TRACE_HEADERS if (v := request.headers.get(k))}
            generates = protocol.requests(parsed)
            reqs = await self.choices.submit_all(generates, trace_context, parsed.params)
        except ApiError as err:
            return error_response(err)
        if parsed.tools is not None:
            telemetry.observer().tools_offered(parsed.tools.choice_label)
        replies = self.choices.replies(parsed, chat, generates, reqs)
        if parsed.stream:
            events = self.choices.events(reqs, replies, parsed.num_candidates)
            return StreamingResponse(events, media_type="text/event-stream")
        return await self.choices.whole(request, reqs, replies, parsed)

    def _authorize(self, request: HttpRequest) -> None:
        if self.key_checker is None:
            return
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        if not self.key_checker(key):
            raise ApiError(401, "invalid or missing API key", code="invalid_api_key")


async def _http_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    return error_response(ApiError(exc.status_code, str(exc.detail), code=code))
