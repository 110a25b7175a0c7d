"""Unary calls carried over one long-lived bidirectional stream, for a round's hot calls.

A unary call in grpcio pays for a new call each time: on the client its creation and metadata,
on a sync server a new-call event, a thread-pool hand-off and a receive, each a thread wake-up.
On the 2-core dev box a bare unary echo from a grpc.aio client to a sync server takes ~0.7 ms,
the same echo as one message each way on an open stream ~0.2 ms
(benchmarks/rpc_overhead.py). So Forward, Verify and Propose also exist as
``*Stream`` methods: the client writes one request and reads its one reply, one call at a
time per stream, and the server answers each request as its unary method would.

What a caller sees is a unary call's: the reply, or a ``grpc.aio.AioRpcError`` with the unary
method's status (the server ends the stream with it) or DEADLINE_EXCEEDED when the reply does
not come in time (the stream is cancelled, so a late reply is never taken for the next one's).
After any error the next call opens a new stream; a stream that ended between calls (the
server restarted or drained) is replaced before anything is written on it, so that costs a
call nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import grpc

Request = TypeVar("Request")
Reply = TypeVar("Reply")


class StreamedUnary(Generic[Request, Reply]):
    """``await call(request, timeout=s)`` over ``open_stream()`` (a stream-stream
    multicallable of the channel, e.g. ``stub.ForwardStream``); concurrent callers take turns.
    """

    def __init__(self, open_stream: Callable[[], Any]) -> None:
        self._open_stream = open_stream
        self._call: Any = None
        self._turn = asyncio.Lock()
        self._aborted = ""  # why abort() ended the call in flight

    async def __call__(self, request: Request, timeout: float) -> Reply:
        async with self._turn:
            try:
                async with asyncio.timeout(timeout):
                    call = await self._send(request)
                    reply = await self._receive(call)
            except TimeoutError:
                self.close()
                raise _error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
            except asyncio.CancelledError:
                self.close()
                if not self._aborted or _cancelling():
                    raise
                raise _error(grpc.StatusCode.UNAVAILABLE, self._aborted) from None
            except BaseException:
                self.close()
                raise
            finally:
                self._aborted = ""
            return reply

    def abort(self, why: str) -> None:
        """Ends the call in flight, if any: its caller gets UNAVAILABLE (``why``) now, not at
        its deadline."""
        if self._call is not None and self._turn.locked():
            self._aborted = why
            self.close()

    async def _send(self, request: Request) -> Any:
        """Writes ``request`` on the open stream, or on a new one if that one had ended."""
        try:
            return await self._write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            # The stream ended before the request left (a restart, a drain, not yet seen by
            # done()): nothing was sent, so a new stream takes it, once.
            return await self._write(request)

    async def _write(self, request: Request) -> Any:
        if self._call is None or self._call.done():
            self._call = self._open_stream()
        call = self._call
        try:
            await call.write(request)
        except BaseException:
            self._drop(call)
            raise
        return call

    async def _receive(self, call: Any) -> Reply:
        reply = await call.read()
        if reply is grpc.aio.EOF:  # ended with OK but no reply: read() raised otherwise
            raise _error(grpc.StatusCode.UNAVAILABLE, "the stream ended without a reply")
        return reply

    def _drop(self, call: Any) -> None:
        call.cancel()
        if self._call is call:
            self._call = None

    def close(self) -> None:
        if self._call is not None:
            self._drop(self._call)


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just the call under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    empty = grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, empty, empty, details=details)


class StreamGate:
    """Bounds the open streams of a sync server: each holds a thread of the server's pool for
    as long as it is open, and the unary calls (health checks among them) need some left."""

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._open = 0
        self._lock = threading.Lock()
        self._waiting: set[grpc.ServicerContext] = set()  # streams between two requests
        self._closed = False

    def close(self) -> None:
        """For a drain (plumbing/drain.py), after the server stopped taking new calls: no
        stream takes another request. Those waiting for one are cancelled now, and those
        answering one end after its reply, so the drain ends with the calls in flight instead of
        its grace period; the client's next call opens a new stream, which the server refuses.
        """
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), set()
        for context in waiting:
            context.cancel()

    def serve(
        self,
        requests: Iterator[Request],
        context: grpc.ServicerContext,
        answer: Callable[[Request, grpc.ServicerContext], Reply],
    ) -> Iterator[Reply]:
        """The server side of a stream: ``answer`` (the unary method) for each request, in
        order; its abort ends the stream with its status."""
        with self._lock:
            admitted = self._open < self.max_open
            self._open += admitted
        if not admitted:
            # After the first request, not before: a client whose write met an ended stream
            # could see an INTERNAL error instead of this status.
            next(requests, None)
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.max_open} streams are open already; use the unary method",
            )
        try:
            for request in self._until_closed(requests, context):
                yield answer(request, context)
        finally:
            with self._lock:
                self._open -= 1

    def _until_closed(
        self, requests: Iterator[Request], context: grpc.ServicerContext
    ) -> Iterator[Request]:
        while True:
            with self._lock:
                if self._closed:
                    return
                self._waiting.add(context)
            try:
                # Raises grpc.RpcError once close() cancels the stream: grpc ends it quietly.
                request = next(requests, None)
            finally:
                with self._lock:
                    self._waiting.discard(context)
            if request is None:
                return
            yield request
