"""Compiled structured-output formats, kept by format and compiled off the event loop.

Compiling a format costs 0.3-9 ms on the dev box (a large enum or alternation the most; the
vocabulary's first view 0.18 s more), and the router's event loop also drives every other
request's round and stream. So a format not seen lately compiles in a worker thread (llguidance
releases the GIL while it compiles), and a request gets a copy of the compiled matcher (4-25 us):
an app that sends one schema with every request, or ``n`` choices of one request, compile it once.
Refusals are kept too, so a bad format sent again is refused at once. Lookups, compilations
and refusals are reported to router.telemetry (Prometheus: router/metrics.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from protos import generation_pb2
from router import telemetry
from router.request import SamplingOptions
from router.structured_output import (
    CompiledFormat,
    Constraint,
    compile_spec,
    refuse_with_ignore_eos,
)
from router.tokenizer import Tokenizer

CAPACITY = 64  # formats kept; the least recently used goes first


class FormatCache:
    def __init__(self, tokenizer: Tokenizer, capacity: int = CAPACITY) -> None:
        self._tokenizer = tokenizer
        self._capacity = capacity
        self._kept: OrderedDict[bytes, CompiledFormat] = OrderedDict()
        self._compiling: dict[bytes, asyncio.Future[CompiledFormat | None]] = {}
        self.num_compiled = 0  # compilations, for tests and status

    async def warm(self, spec: generation_pb2.StructuredOutput) -> None:
        """Compiles ``spec`` in a worker thread unless it is kept; concurrent requests with
        one new format wait for one compilation."""
        if spec.WhichOneof("format") is None:
            return
        key = _key(spec)
        telemetry.observer().format_looked_up(hit=key in self._kept)
        if key in self._kept:
            return
        pending = self._compiling.get(key)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self._compile, spec))
            self._compiling[key] = pending
            pending.add_done_callback(lambda _: self._compiling.pop(key, None))
        compiled = await asyncio.shield(pending)  # one caller going away stops no other
        if compiled is not None:
            self._keep(key, compiled)

    def constraint(
        self, sampling: generation_pb2.SamplingParams, options: SamplingOptions
    ) -> Constraint | None:
        """A new request's grammar state (None: no format). A format that was not warmed, or
        has been evicted since, compiles here, on the caller's thread."""
        refuse_with_ignore_eos(sampling, options)
        spec = sampling.structured_output
        if spec.WhichOneof("format") is None:
            return None
        key = _key(spec)
        compiled = self._kept.get(key)
        if compiled is None:
            compiled = self._compile(spec)
            assert compiled is not None  # a format is set
        self._keep(key, compiled)
        if compiled.error:  # each request sent with it, though the refusal is kept
            telemetry.observer().format_refused(compiled.kind)
        return compiled.constraint()

    def _compile(self, spec: generation_pb2.StructuredOutput) -> CompiledFormat | None:
        """Runs in a worker thread (``warm``) or on the caller's (``constraint``)."""
        self.num_compiled += 1
        started = time.perf_counter()
        compiled = compile_spec(spec, self._tokenizer)
        if compiled is not None:
            telemetry.observer().format_compiled(compiled.kind, time.perf_counter() - started)
        return compiled

    def _keep(self, key: bytes, compiled: CompiledFormat) -> None:
        self._kept[key] = compiled
        self._kept.move_to_end(key)
        while len(self._kept) > self._capacity:
            self._kept.popitem(last=False)


def _key(spec: generation_pb2.StructuredOutput) -> bytes:
    return spec.SerializeToString(deterministic=True)
