"""Start-up refusals: what a service says in one line and exits on (status 2), never as a
traceback. Each kind keeps its natural base too (a missing file is a FileNotFoundError)."""

from __future__ import annotations


class StartupRefused(Exception):
    """The service cannot start as configured; the message says why and what to change."""
