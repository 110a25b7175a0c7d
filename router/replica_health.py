"""How long a draft replica may take, and whether to call it at all (a circuit breaker).

Deadlines follow the replica's measured call times: a bounded multiple of the recent p99
(``multiple * p99``, clamped to ``[floor_s, cap_s]``), so a hung replica costs one step a little
more than its usual round, not ``--draft-timeout``. Each kind of call (Propose, Ingest) has its own
window; an Ingest's is per token, counted over at least ``min_units`` tokens.

The breaker's states:

- ``closed``: called every step.
- ``suspect``: it missed a deadline. Not called (its requests take target-only steps and keep
  their pending updates, so nothing is lost and nothing re-ingested when it answers again:
  a replica that was only late has applied the update it missed, and drops that part of the
  merged one, draft_service/late_updates.py);
  the pool's probe checks its health. One good probe closes it again; failed probes for
  ``eject_after_s`` open it (a hung replica's requests then move to the others).
- ``open``: ejected (its requests move to other replicas). After a backoff that doubles with
  each ejection in a row (``backoff_s`` .. ``max_backoff_s``) the probe tries it again; a
  healthy answer re-admits it, empty.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

CLOSED, SUSPECT, OPEN = "closed", "suspect", "open"
P99_REFRESH_S = 0.05
P99_REFRESH_ADDS = 8


@dataclass(frozen=True)
class DeadlinePolicy:
    multiple: float = 2.0  # of the recent p99
    # Never shorter: a skipped round costs more than a short wait. On the H200 a batch-1
    # Propose takes ~1.5 ms, yet 2-3 calls in ~3,000 missed a deadline under the old 5 ms
    # floor, and each miss cost 8-16 rounds without drafts (and then a re-ingest, which
    # draft_service/late_updates.py has since removed) (2026-12-03).
    floor_s: float = 0.02
    cap_s: float = 10.0  # never longer (--draft-timeout)
    initial_s: float = 2.0  # before enough calls were measured
    window: int = 64  # recent calls kept per kind
    horizon_s: float = 5.0  # of which the last seconds count
    min_samples: int = 8
    # A call's fixed cost, in tokens: per-token times are taken over at least this many, so a
    # short Ingest (mostly round trip) does not make a per-token p99 that long ones multiply.
    min_units: int = 64


class LatencyWindow:
    """The last ``size`` call times; the p99 looks at the last ``horizon_s`` of them (at least
    ``min_samples``), so that a slow spell long past does not keep deadlines long."""

    def __init__(self, size: int, horizon_s: float = 5.0, min_samples: int = 8) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=size)
        self.horizon_s, self.min_samples = horizon_s, min_samples
        self._p99: float | None = None
        self._p99_at = 0.0
        self._adds_since = 0

    def add(self, seconds: float) -> None:
        self.samples.append((time.monotonic(), seconds))
        self._adds_since += 1

    def p99(self) -> float:
        """Recomputed after a few new samples or a short while, not on every call: a round
        asks for it once or more, and the sort over the window cost tens of us each time on
        the GPU box's router (py-spy, 2026-12-02). A deadline a few calls behind is harmless."""
        now = time.monotonic()
        fresh = now - self._p99_at < P99_REFRESH_S and self._adds_since < P99_REFRESH_ADDS
        if self._p99 is None or not fresh:
            self._p99, self._p99_at, self._adds_since = self._compute_p99(now), now, 0
        return self._p99

    def _compute_p99(self, now: float) -> float:
        since = now - self.horizon_s
        recent = [s for t, s in self.samples if t >= since]
        if len(recent) < self.min_samples:
            recent = [s for _, s in list(self.samples)[-self.min_samples :]]
        ordered = sorted(recent)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


@dataclass
class ReplicaHealth:
    policy: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    eject_after_s: float = 8.0  # suspected this long without a good probe: ejected
    backoff_s: float = 0.5
    max_backoff_s: float = 4.0  # a restarted replica is back in rotation within this
    state: str = CLOSED
    failures: int = 0  # in a row
    ejections: int = 0  # in a row, for the backoff
    retry_at: float = 0.0  # when an open breaker may be probed
    suspected_at: float = 0.0
    misses: int = 0  # counters for GetServerStatus and the reliability suite
    num_ejections: int = 0
    _windows: dict[str, LatencyWindow] = field(default_factory=dict)

    # ---- deadlines -----------------------------------------------------------------------

    def deadline_s(self, kind: str, units: int = 1) -> float:
        """The deadline of a call of ``kind`` moving ``units`` (tokens, for an Ingest)."""
        window = self._windows.get(kind)
        p = self.policy
        if window is None or len(window.samples) < p.min_samples:
            return min(p.initial_s, p.cap_s)
        return min(p.cap_s, max(p.floor_s, p.multiple * window.p99() * max(units, p.min_units)))

    def record(self, kind: str, seconds: float, units: int = 1) -> None:
        window = self._windows.setdefault(
            kind, LatencyWindow(self.policy.window, self.policy.horizon_s, self.policy.min_samples)
        )
        window.add(seconds / max(units, self.policy.min_units))
        self.failures = 0
        if self.state == CLOSED:
            self.ejections = 0

    # ---- the breaker -----------------------------------------------------------------------

    @property
    def callable(self) -> bool:
        return self.state == CLOSED

    def missed(self) -> None:
        """A call ran past its deadline: skip the replica until a probe finds it answering."""
        self.misses += 1
        self.failures += 1
        if self.state == CLOSED:
            self.state, self.suspected_at = SUSPECT, time.monotonic()

    def trip(self) -> None:
        """Opens the breaker: the replica is ejected until its backoff has passed."""
        self.state = OPEN
        self.ejections += 1
        self.num_ejections += 1
        backoff = min(self.max_backoff_s, self.backoff_s * 2 ** (self.ejections - 1))
        self.retry_at = time.monotonic() + backoff

    def wants_probe(self) -> bool:
        return self.state == SUSPECT or (
            self.state == OPEN and time.monotonic() >= self.retry_at
        )

    def probe_failed(self) -> bool:
        """Returns True when this failure opened the breaker (the replica is ejected now)."""
        if self.state == OPEN:
            self.trip()  # the next backoff, doubled
            return False
        self.failures += 1
        if time.monotonic() - self.suspected_at >= self.eject_after_s:
            self.trip()
            return True
        return False

    def probe_passed(self) -> None:
        self.state, self.failures = CLOSED, 0
