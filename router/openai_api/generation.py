"""A generation's choices on the router's scheduler: submitted all or none, then answered as
one whole reply or as a stream of SSE events; a client that goes away aborts them all.

OpenAIServer (router/openai_api/app.py) authorizes and parses the request; this runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response

from protos import generation_pb2 as pb
from router import telemetry
from router.errors import InvalidRequest, Overloaded, ServiceFailure
from router.openai_api import protocol
from router.openai_api.best_of import ranked
from router.openai_api.choices import ChoiceFailed, interleaved
from router.openai_api.echo import Echo
from router.openai_api.errors import error_response, from_router_error
from router.openai_api.responses import DONE, Reply, sse, usage
from router.request import Request

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a reply nobody is left to read


class ChoiceRunner:
    """Runs the choices (OpenAI's n, or best_of's candidates) of one parsed request, each a
    router Request of its own, and turns their items into the OpenAI reply."""

    def __init__(
        self,
        servicer: Any,  # router.servicer.GenerationServicer: builds and validates requests
        model_name: str,
    ) -> None:
        self.servicer = servicer
        self.scheduler = servicer.scheduler
        self.model_name = model_name

    async def submit_all(
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

    def replies(
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

    # ---- a reply that does not stream --------------------------------------------------------

    async def whole(
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
            return error_response(from_router_error(err))
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

    # ---- a stream ----------------------------------------------------------------------------

    async def events(self, reqs: list[Request], replies: list[Reply], n: int) -> AsyncIterator[str]:
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
