"""Which router drives this target: one at a time.

A router owns the KV slots it hands out (router/kv_manager.py), so two routers on one target
each write their requests' KV into slots the other gave to its own: every output of both goes
wrong, with no error anywhere. A router therefore claims the target (the ``Claim`` call) before
its first step, renews the claim with each health probe, and names itself on every call
(``splitspec-router-id`` metadata); a call from another router while the claim is live is
refused FAILED_PRECONDITION, naming the owner. A claim lapses ``lease_s`` after the owner's last
call, so a router that died (or hung) hands over to the next without anyone's help; one that
stops hands over at once (``give_up``). Calls without the metadata (tools, tests) are not
checked. Claims and checks run on the gRPC handler threads, never waiting for the compute
thread: a long prefill must not let its own router's claim lapse.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from plumbing.grpc_util import ROUTER_ID_KEY

DEFAULT_LEASE_S = 5.0  # a claim taken by a call rather than by Claim


class Held(Exception):
    """Another router's claim is live."""


@dataclass
class Claim:
    router_id: str
    name: str
    lease_s: float
    last_call: float


class Ownership:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._claim: Claim | None = None

    def claim(self, router_id: str, name: str, lease_s: float) -> None:
        """Makes ``router_id`` the owner, or renews its claim; raises Held."""
        with self._lock:
            now = self._clock()
            self._refuse_if_held(router_id, now)
            self._claim = Claim(router_id, name or router_id, lease_s, now)

    def give_up(self, router_id: str) -> None:
        with self._lock:
            if self._claim is not None and self._claim.router_id == router_id:
                self._claim = None

    def admit(self, router_id: str) -> None:
        """Checks a call's router (``''``: none named, not checked) and renews its claim; a call
        while no claim is live claims the target for its router. Raises Held."""
        if not router_id:
            return
        with self._lock:
            now = self._clock()
            self._refuse_if_held(router_id, now)
            if self._claim is None:  # none was live: the call claims the target
                self._claim = Claim(router_id, router_id, DEFAULT_LEASE_S, now)
            else:
                self._claim.last_call = now

    def _refuse_if_held(self, router_id: str, now: float) -> None:
        held = self._claim
        if held is None or held.router_id == router_id:
            return
        idle = now - held.last_call
        if idle >= held.lease_s:
            self._claim = None  # lapsed: its router died or hung
            return
        raise Held(
            f"this target is driven by another router ({held.name}; its last call "
            f"{idle:.1f} s ago, its claim lapses {held.lease_s:.0f} s after its last call): one "
            f"router per target, each owns the target's KV slots"
        )


def router_id_of(context) -> str:  # grpc.ServicerContext
    """The calling router's id, from the call's metadata; '' when the caller named none."""
    for key, value in context.invocation_metadata() or ():
        if key == ROUTER_ID_KEY:
            return value
    return ""
