"""Ties a service's life to the launcher that started it (no orphans after a crashed test)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PARENT_PID_ENV = "SPLITSPEC_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent_if_asked() -> None:
    """Called first thing by each service: with SPLITSPEC_PARENT_PID set (by LocalStack), the
    kernel sends SIGTERM when that parent dies; if it already died, exit now."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    # Set after exec in the service itself: a preexec_fn would force a plain fork() in the
    # launcher, and gRPC's fork handlers can then abort the child before it execs.
    die_with_parent(int(parent), signal.SIGTERM, "launcher exited before this service started")


def die_with_parent(parent: int, sig: int, gone: str) -> None:
    """Asks the kernel for ``sig`` when this process's parent dies; exits now (``gone``) if
    ``parent`` is not the parent any more (it died before the request took)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        raise SystemExit(gone)
