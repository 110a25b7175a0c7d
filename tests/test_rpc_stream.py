"""Unary calls over one long-lived stream (plumbing/rpc_stream.py) behave as unary calls: each
reply is its own request's, errors carry the server's status, a missed deadline never lets a
late reply answer the next call, and a stream that ended between calls costs nothing.

A sync gRPC server with a thread pool (as the services run) and a grpc.aio client (as the
router calls), in this process, on raw bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from plumbing.grpc_util import CHANNEL_OPTIONS
from plumbing.rpc_stream import StreamedUnary, StreamGate
from splitspec.launcher import free_port

METHOD = "/splitspec.test.Echo/EchoStream"


def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
    """b"sleep:S" sleeps S seconds, b"bad" aborts INVALID_ARGUMENT, anything else is echoed."""
    if request.startswith(b"sleep:"):
        time.sleep(float(request[6:]))
    if request == b"bad":
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
    return b"re:" + request


class Echo:
    def __init__(self, max_open: int = 4) -> None:
        self.port = free_port()
        self.gate = StreamGate(max_open)
        self.streams_opened = 0
        self.server = self._start()

    def _start(self) -> grpc.Server:
        def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            self.streams_opened += 1
            return self.gate.serve(requests, context, answer)

        handler = grpc.method_handlers_generic_handler(
            "splitspec.test.Echo", {"EchoStream": grpc.stream_stream_rpc_method_handler(stream)}
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        return server

    def restart(self) -> None:
        self.server.stop(grace=None).wait()
        self.server = self._start()


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    try:
        yield server
    finally:
        server.server.stop(grace=None)


def run(echo: Echo, body) -> None:
    async def main() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{echo.port}") as channel:
            await body(StreamedUnary(channel.stream_stream(METHOD)), channel)

    asyncio.run(main())


def test_replies_in_order_on_one_stream(echo: Echo) -> None:
    async def body(call: StreamedUnary, channel) -> None:
        for i in range(20):
            assert await call(b"%d" % i, timeout=5) == b"re:%d" % i
        # Concurrent callers take turns; each gets its own reply.
        replies = await asyncio.gather(*(call(b"c%d" % i, timeout=5) for i in range(10)))
        assert replies == [b"re:c%d" % i for i in range(10)]

    run(echo, body)
    assert echo.streams_opened == 1


def test_error_carries_the_status_and_the_next_call_gets_a_new_stream(echo: Echo) -> None:
    async def body(call: StreamedUnary, channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"bad", timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "bad request"
        assert await call(b"after", timeout=5) == b"re:after"

    run(echo, body)
    assert echo.streams_opened == 2


def test_missed_deadline_never_answers_the_next_call(echo: Echo) -> None:
    async def body(call: StreamedUnary, channel) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(b"sleep:0.3", timeout=0.05)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The late reply to "sleep:0.3" must not be taken for this one's.
        assert await call(b"next", timeout=5) == b"re:next"
        await asyncio.sleep(0.4)  # the late reply has been sent (to a cancelled stream) by now
        assert await call(b"later", timeout=5) == b"re:later"

    run(echo, body)


def test_an_aborted_call_ends_unavailable_at_once_and_the_next_goes_on(echo: Echo) -> None:
    async def body(call: StreamedUnary, channel) -> None:
        waiting = asyncio.ensure_future(call(b"sleep:5", timeout=30))  # a hung server's call
        await asyncio.sleep(0.2)
        started = time.monotonic()
        call.abort("target lost (test)")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await waiting
        assert time.monotonic() - started < 1.0, "the call waited for its reply"
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == "target lost (test)"
        call.abort("between calls: nothing to end")
        assert await call(b"next", timeout=5) == b"re:next"
        # A task cancelled while its call waits is still cancelled, not an RPC error.
        cancelled = asyncio.ensure_future(call(b"sleep:5", timeout=30))
        await asyncio.sleep(0.2)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    run(echo, body)


def test_stream_ended_between_calls_is_replaced_without_an_error(echo: Echo) -> None:
    async def body(call: StreamedUnary, channel) -> None:
        assert await call(b"one", timeout=5) == b"re:one"
        stream = call._call
        echo.restart()  # as a target restart or a drain ends every stream
        for _ in range(200):
            if stream.done():
                break
            await asyncio.sleep(0.01)
        assert stream.done()
        assert await call(b"two", timeout=5) == b"re:two"

    run(echo, body)


def test_a_closed_gate_ends_its_streams_between_calls(echo: Echo) -> None:
    """A drain: once the server stops taking calls and the gate closes, a stream waiting for a
    request ends at once and one answering a request ends after its reply, so the server stops
    long before its grace period; the next call is refused."""
    grace_s = 30

    async def body(busy: StreamedUnary, channel) -> None:
        idle = StreamedUnary(channel.stream_stream(METHOD))
        assert await idle(b"a", timeout=5) == b"re:a"
        answering = asyncio.ensure_future(busy(b"sleep:0.5", timeout=5))
        await asyncio.sleep(0.2)
        stopped = echo.server.stop(grace=grace_s)
        echo.gate.close()
        assert await answering == b"re:sleep:0.5"
        assert await asyncio.to_thread(stopped.wait, grace_s / 3), "the drain took the grace"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await idle(b"b", timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    assert echo.streams_opened == 0
    run(echo, body)
    assert echo.streams_opened == 2


def test_gate_refuses_streams_past_its_bound() -> None:
    echo = Echo(max_open=1)
    try:

        async def body(call: StreamedUnary, channel) -> None:
            assert await call(b"held", timeout=5) == b"re:held"  # holds the one stream
            other = StreamedUnary(channel.stream_stream(METHOD))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await other(b"refused", timeout=5)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            call.close()
            for _ in range(200):  # the server sees the cancel and frees the stream
                try:
                    assert await other(b"now", timeout=5) == b"re:now"
                    return
                except grpc.aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.01)
            raise AssertionError("the closed stream was never freed")

        run(echo, body)
    finally:
        echo.server.stop(grace=None)


def test_servers_take_the_keepalive_pings_of_idle_streams() -> None:
    """An idle stream keeps its connection pinging; a server that counts those pings as strikes
    sends GOAWAY "too_many_pings" after ~3.5 minutes, cancelling every call on the connection
    (seen on this stack before the option was set)."""
    options = dict(CHANNEL_OPTIONS)
    allowed_ms = options["grpc.http2.min_ping_interval_without_data_ms"]
    assert allowed_ms < options["grpc.keepalive_time_ms"]


class FakeStream:
    """A stream-stream call whose write fails as grpc.aio's does on a stream that has ended
    unseen (an INTERNAL error from Core), or succeeds and answers."""

    def __init__(self, ended: bool) -> None:
        self.ended, self.cancelled, self.written = ended, False, []

    def done(self) -> bool:
        return self.cancelled

    async def write(self, request: bytes) -> None:
        if self.ended:
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, empty, empty, "from Core")
        self.written.append(request)

    async def read(self) -> bytes:
        return b"re:" + self.written[-1]

    def cancel(self) -> None:
        self.cancelled = True


def test_a_write_that_meets_an_ended_stream_goes_out_on_a_new_one() -> None:
    streams = [FakeStream(ended=True), FakeStream(ended=False), FakeStream(ended=True),
               FakeStream(ended=True)]  # fmt: skip
    opened = iter(streams)
    call: StreamedUnary[bytes, bytes] = StreamedUnary(lambda: next(opened))

    async def main() -> None:
        assert await call(b"a", timeout=5) == b"re:a"
        assert streams[0].cancelled and streams[1].written == [b"a"]
        streams[1].cancel()  # ended, and seen: replaced before the write
        with pytest.raises(grpc.aio.AioRpcError) as info:  # only once: then the error stands
            await call(b"b", timeout=5)
        assert info.value.code() == grpc.StatusCode.INTERNAL

    asyncio.run(main())
