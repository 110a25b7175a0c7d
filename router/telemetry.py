"""Where the router reports what it does, for metrics; by default nobody listens.

The scheduler, the speculative round and the draft pool call ``observer()``'s methods at the
points that matter (a block of tokens committed, a request finished, a tree verified, a draft
call made), and so do admission, the format cache and the HTTP API (a request admitted, a
format compiled or refused, tool calls made). ``router.metrics`` installs an observer that feeds
Prometheus; with none installed the calls cost a method lookup. All run on the router's event
loop, so no locks, except ``format_compiled``: a worker thread compiles (router/format_cache.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any


class Observer:
    """The no-op observer: every hook the router calls, doing nothing."""

    def tokens_committed(self, req: Any, num_tokens: int, now: float) -> None:
        """A block of ``num_tokens`` was streamed to ``req`` at ``now`` (perf_counter)."""

    def request_finished(self, req: Any, reason: int, now: float) -> None:
        """``req`` ended with FinishReason ``reason``; its counters are final."""

    def request_failed(self, req: Any, message: str, now: float) -> None:
        """``req`` ended with a server error (the target lost, a step failed): ``message``."""

    def tree_verified(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One verify step of one request: drafts sent, drafts the target accepted."""

    def target_call(self, method: str, device_ms: float) -> None:
        """A Forward or Verify call and the target's own time for it."""

    def draft_call(self, address: str, method: str, seconds: float) -> None:
        """A call to a draft replica that returned (successfully or not)."""

    def draft_failure(self, address: str, reason: str) -> None:
        """A draft replica was taken out of rotation."""

    def request_admitted(self, req: Any) -> None:
        """``req`` passed validation and joined the scheduler's queue (either API)."""

    def format_looked_up(self, hit: bool) -> None:
        """A request's structured-output format was looked up: kept compiled (or refused), or
        not (it waited for a compilation, its own or a concurrent request's)."""

    def format_compiled(self, kind: str, seconds: float) -> None:
        """A format of ``kind`` (a StructuredOutput field) took ``seconds`` to compile, or to
        fail to. Mostly called from a worker thread: an observer must be thread-safe here."""

    def format_refused(self, kind: str) -> None:
        """A request was refused because its format of ``kind`` does not compile."""

    def tokens_forced(self, num_tokens: int) -> None:
        """A tree on its way to Verify holds ``num_tokens`` drafts that its request's format
        forced (router/grammar_tree.py); they count in usage's ``forced_tokens`` too."""

    def tools_offered(self, tool_choice: str) -> None:
        """An HTTP request with tools was admitted: ``auto``, ``required``, ``named``, ``none``."""

    def tool_calls_made(self, num_calls: int) -> None:
        """A reply sent to an HTTP client held ``num_calls`` tool calls."""


_observer: Observer = Observer()


def observer() -> Observer:
    return _observer


def install(new: Observer) -> None:
    """Adds ``new`` beside the observers installed before it (metrics, the request log)."""
    global _observer
    _observer = new if type(_observer) is Observer else FanOut(_observer, new)


class FanOut(Observer):
    """Two observers in turn (nested for more); each hook below passes its call to both."""

    def __init__(self, first: Observer, second: Observer) -> None:
        self.pair = (first, second)


def _passed_on(name: str) -> Any:
    def hook(self: FanOut, *args: Any, **kwargs: Any) -> None:
        for o in self.pair:
            getattr(o, name)(*args, **kwargs)

    hook.__name__ = hook.__qualname__ = name
    return hook


for _name, _hook in list(vars(Observer).items()):
    if callable(_hook) and not _name.startswith("_"):
        setattr(FanOut, _name, _passed_on(_name))


@contextlib.contextmanager
def draft_timer(address: str, method: str) -> Iterator[None]:
    """Times one call to a draft replica, however it ends."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _observer.draft_call(address, method, time.perf_counter() - started)


def target_replies(forward_reply: Any, verify_reply: Any) -> None:
    """Reports the target's own time for a step's Forward and Verify calls (either may be None)."""
    if forward_reply is not None:
        _observer.target_call("Forward", forward_reply.forward_ms)
    if verify_reply is not None:
        _observer.target_call("Verify", verify_reply.forward_ms)
