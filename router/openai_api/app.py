"""The ASGI app: OpenAI endpoints, /health and /metrics over the router's own scheduler.

It runs in the router's event loop (router.http_server), so a request here is submitted to
the same scheduler, validated by the same code and batched with the gRPC API's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from protos import generation_pb2 as pb
from router import telemetry
from router.errors import InvalidRequest, Overloaded, ServiceFailure
from router.openai_api import protocol, tokenize
from router.openai_api.best_of import ranked
from router.openai_api.body import DEFAULT_MAX_BODY_BYTES, read_body
from router.openai_api.choices import ChoiceFailed, interleaved
from router.openai_api.echo import Echo
from router.openai_api.errors import ApiError, from_router_error
from router.openai_api.responses import DONE, Reply, sse, usage
from router.request import TRACE_HEADERS, Request

# Given the bearer token (None when the header is missing), says whether it may call /v1/*.
KeyChecker = Callable[[str | None], bool]
T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a reply nobody is left to read


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
            return _error(err)
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: HttpRequest) -> Response:
        """OpenAI's retrieve: the served model's card, as listed; another id is a 404."""
        try:
            self._authorize(request)
            self._check_model(request.path_params["model_id"])
        except ApiError as err:
            return _error(err)
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
            return _error(err)

    async def chat(self, request: HttpRequest) -> Response:
        return await self._generate(request, protocol.parse_chat, chat=True)

    async def completions(self, request: HttpRequest) -> Response:
        return await self._generate(request, protocol.parse_completion, chat=False)

    # ---- generation --------------------------------------------------------------------------

    async def _generate(self, request: HttpRequest, parse: Callable, chat: bool) -> Response:
        try:
            self._authorize(request)
            parsed = parse(protocol.parse_body(await read_body(request, self.max_body_bytes)))
            self._check_model(parsed.model)
            trace_context = {k: v for k in TRACE_HEADERS if (v := request.headers.get(k))}
            generates = protocol.requests(parsed)
            reqs = await self._submit_all(generates, trace_context, parsed.params)
        except ApiError as err:
            return _error(err)
        if parsed.tools is not None:
            telemetry.observer().tools_offered(parsed.tools.choice_label)
        replies = self._replies(parsed, chat, generates, reqs)
        if parsed.stream:
            events = self._events(reqs, replies, parsed.num_candidates)
            return StreamingResponse(events, media_type="text/event-stream")
        return await self._whole(request, reqs, replies, parsed)

    async def _whole(
        self,
        request: HttpRequest,
        reqs: list[Request],
        replies: list[Reply],
        parsed: protocol.ParsedRequest,
    ) -> Response:
        """The reply to a request that did not stream: every choice's (with best_of, the best
        candidates'), the usage of every candidate. A client that goes away first gets none:
        its requests are aborted and give their slots back, as a stream's are."""
        collecting = asyncio.gather(*(self._collect(req) for req in reqs))
        try:
            wholes = await _unless_client_leaves(request, collecting)
        except ServiceFailure as err:
            for req in reqs:  # the other choices stop too
                self._abort_unfinished(req)
            return _error(from_router_error(err))
        if wholes is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # to a closed connection
        chosen = ranked(wholes, parsed.n, parsed.num_candidates)
        for index, i in enumerate(chosen):
            replies[i].index = index  # best_of's choices are numbered in rank order
        bodies = [replies[i].whole(wholes[i]) for i in chosen]
        _report_tool_calls(replies[i] for i in chosen)  # whole() has parsed their text
        choices = [body["choices"][0] for body in bodies]
        shown = [reply.shown(whole) for reply, whole in zip(replies, wholes, strict=True)]
        total = usage(*shown, n=parsed.num_candidates)  # every candidate's tokens: all billed
        return JSONResponse({**bodies[0], "choices": choices, "usage": total})

    def _replies(
        self,
        parsed: protocol.ParsedRequest,
        chat: bool,
        generates: list[pb.GenerateRequest],
        reqs: list[Request],
    ) -> list[Reply]:
        """One Reply per choice, all under the first one's id."""
        replies: list[Reply] = []
        for i, (generate, req) in enumerate(zip(generates, reqs, strict=True)):
            shown = parsed.generate.sampling.logprobs and not parsed.hidden_logprobs
            reply = Reply(chat, self.model_name, parsed.include_usage, logprobs=shown, index=i,
                          id=replies[0].id if replies else "")  # fmt: skip
            if parsed.echo:
                tokenizer = self.scheduler.tokenizer
                reply.echo = Echo.of(generate, req, tokenizer, parsed.scores_only)
            if parsed.tools is not None:
                reply.tool_parser = parsed.tools.parser()  # each choice is read on its own
            replies.append(reply)
        return replies

    def _authorize(self, request: HttpRequest) -> None:
        if self.key_checker is None:
            return
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        if not self.key_checker(key):
            raise ApiError(401, "invalid or missing API key", code="invalid_api_key")

    async def _submit_all(
        self,
        generates: list[pb.GenerateRequest],
        trace_context: dict[str, str],
        params: Mapping[str, str],
    ) -> list[Request]:
        """Every choice's request, or none: one refused aborts those already submitted. The
        formats compile first (off the loop), then all are submitted without a pause.
        ``params``: the body's names for fields, for a refusal's ``param``."""
        reqs: list[Request] = []
        try:
            for generate in generates:
                await self.servicer.prepare(generate)
            for generate in generates:
                req = self.servicer._build(generate, trace_context)  # the gRPC API's validation
                self.scheduler.submit(req)
                reqs.append(req)
        except (InvalidRequest, Overloaded, ServiceFailure) as err:  # a down target: 503
            for req in reqs:
                self._abort_unfinished(req)
            raise from_router_error(err, params) from err
        return reqs

    async def _collect(self, req: Request) -> pb.GenerateResponse:
        """All of the request's items as one: text, token ids and logprobs joined in order,
        the last item's finish, usage and timings."""
        whole, parts = pb.GenerateResponse(), []
        try:
            while True:
                item = await _next_item(req)
                parts.append(item.text)
                whole.MergeFrom(item)  # appends repeated fields, but replaces the text
                if item.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                    whole.text = "".join(parts)
                    return whole
        finally:
            self._abort_unfinished(req)

    async def _events(
        self, reqs: list[Request], replies: list[Reply], n: int
    ) -> AsyncIterator[str]:
        """SSE events of every choice, then the usage chunk (include_usage) and [DONE]; a
        failed choice's error event ends the stream. A client that goes away closes this
        generator: every choice's request is aborted and gives its slots back."""
        finals: dict[int, pb.GenerateResponse] = {}  # by choice index
        streams = [self._choice_events(*pair, finals) for pair in zip(reqs, replies, strict=True)]
        try:
            async for event in interleaved(streams):
                yield event
        except ChoiceFailed as failed:
            yield failed.event
            return
        if replies[0].include_usage:
            yield replies[0].usage_chunk([finals[i] for i in range(len(reqs))], n)
        yield DONE

    async def _choice_events(
        self, req: Request, reply: Reply, finals: dict[int, pb.GenerateResponse]
    ) -> AsyncIterator[str]:
        """One choice's chunks; its last item goes to ``finals``."""
        first = True
        try:
            while True:
                try:
                    item = await _next_item(req)
                except ServiceFailure as err:
                    raise ChoiceFailed(sse(from_router_error(err).body())) from err
                for event in reply.chunks(item, first):
                    yield event
                first = False
                if item.finish_reason != pb.FINISH_REASON_UNSPECIFIED:
                    finals[reply.index] = reply.shown(item)
                    _report_tool_calls([reply])
                    return
        finally:
            self._abort_unfinished(req)

    def _abort_unfinished(self, req: Request) -> None:
        if not req.finished:
            self.scheduler.abort(req.request_id)


def _report_tool_calls(replies: Iterable[Reply]) -> None:
    """Counts the tool calls of replies whose whole text their parsers have read."""
    made = sum(r.tool_parser.num_calls for r in replies if r.tool_parser is not None)
    if made:
        telemetry.observer().tool_calls_made(made)


async def _unless_client_leaves(request: HttpRequest, work: asyncio.Future[T]) -> T | None:
    """``work``'s result, or None if the client disconnects first; ``work`` is then cancelled
    and awaited, so that every request it waits on has been aborted (``_collect``)."""
    gone = asyncio.ensure_future(_client_gone(request))
    either: set[asyncio.Future[Any]] = {work, gone}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        work.cancel()  # the server cancelled this handler: the requests stop with it
        raise
    finally:
        gone.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return None


async def _client_gone(request: HttpRequest) -> None:
    """Returns once the client has disconnected. The body has been read, so the ASGI server
    answers receive() only then (uvicorn: http.disconnect once the connection is lost)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _next_item(req: Request) -> pb.GenerateResponse:
    item = await req.outbox.get()
    if isinstance(item, Exception):
        raise item
    return item


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


async def _http_error(request: HttpRequest, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(ApiError(exc.status_code, str(exc.detail), code="not_found"
                           if exc.status_code == 404 else None))
