"""Arrivals before decoding: a burst of new requests is taken in before the next step.

gRPC's asyncio server takes in one new call per turn of the event loop, and a step's stream
writes (one item per running request) fill those turns: while requests stream, a burst's
refusals waited behind them (500 at once against a queue of 50: the last refused after
~300 ms). So a step first waits until no call has arrived for ``quiet_s``, at most
``max_wait_s``: a burst is admitted or refused at once, and decoding pauses for it, boundedly.
"""

from __future__ import annotations

import asyncio
import time


class ArrivalGate:
    def __init__(self, quiet_s: float = 0.002, max_wait_s: float = 0.05) -> None:
        self.quiet_s, self.max_wait_s = quiet_s, max_wait_s
        self._last = 0.0

    def arrived(self) -> None:
        """Called by the servicer as each call comes in."""
        self._last = time.monotonic()

    async def settle(self) -> None:
        """Returns once arrivals have paused (or after ``max_wait_s``)."""
        started = time.monotonic()
        while True:
            now = time.monotonic()
            if now - self._last >= self.quiet_s or now - started >= self.max_wait_s:
                return
            await asyncio.sleep(self.quiet_s / 2)
