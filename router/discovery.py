"""Draft replicas found by DNS: a name (a Kubernetes headless Service, a compose service)
re-resolved every few seconds, so drafts scaled at run time join and leave the pool.

A new address joins the pool at once but serves only after the pool's health probe (which
also tells a draft from any other gRPC server). An address missing from `miss_limit`
answers in a row leaves; one missing answer is not enough, because DNS answers flap (a
round-robin server that truncates, a cache that expires between endpoints updates). A
lookup that fails temporarily changes nothing; a name that does not exist counts as an
empty answer (Kubernetes answers NXDOMAIN for a headless Service with no ready pod).
Nothing here fails a request: lookup errors go to the log and GetServerStatus.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protos import generation_pb2 as pb
from router.draft_pool import DraftPool, DraftReplica

log = logging.getLogger("splitspec.router")

# (host, port) -> "ip:port" strings. Raises NameNotFound or OSError (temporary trouble).
Resolver = Callable[[str, int], Awaitable[list[str]]]


class NameNotFound(Exception):
    """The name does not exist (NXDOMAIN): an empty answer, not a temporary failure."""


def split_host_port(name: str) -> tuple[str, int]:
    """'draft.ns.svc:50071' -> ('draft.ns.svc', 50071); raises ValueError saying why."""
    host, sep, port = name.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--draft-dns wants HOST:PORT, got {name!r}")
    return host.strip("[]"), int(port)


def join_host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def resolve_dns(host: str, port: int) -> list[str]:
    """Every address the system resolver gives (A and AAAA), through getaddrinfo."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        if err.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise NameNotFound(str(err)) from err
        raise
    return sorted({join_host_port(str(info[4][0]), port) for info in infos})


@dataclass
class DraftDiscovery:
    pool: DraftPool
    name: str  # host:port
    interval_s: float = 5.0
    resolver: Resolver = resolve_dns
    miss_limit: int = 2  # answers in a row without an address before it leaves
    lookup_timeout_s: float = 5.0
    clock: Callable[[], float] = time.time
    misses: dict[str, int] = field(default_factory=dict)
    last_resolved: float = 0.0
    last_attempt: float = 0.0
    error: str = ""
    num_lookups: int = 0

    def __post_init__(self) -> None:
        self.host, self.port = split_host_port(self.name)

    @property
    def replicas(self) -> list[DraftReplica]:
        return [r for r in self.pool.replicas if r.source == self.name]

    async def run_forever(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    async def refresh(self) -> None:
        """One lookup, applied to the pool. Never raises (a crash would stop discovery)."""
        answer = await self._lookup()
        if answer is not None:
            self._apply(set(answer))

    async def _lookup(self) -> list[str] | None:
        """The addresses, [] for a name that does not exist, None when the lookup failed."""
        self.num_lookups += 1
        self.last_attempt = self.clock()
        try:
            answer = await asyncio.wait_for(
                self.resolver(self.host, self.port), self.lookup_timeout_s
            )
        except NameNotFound as err:
            self._set_error(f"{self.host} does not resolve ({err})")
            return []
        except TimeoutError:  # the resolver's own, or ours: both say nothing of themselves
            self._set_error(
                f"lookup of {self.host} failed (no answer in {self.lookup_timeout_s:g} s)"
            )
            return None
        except (OSError, ValueError) as err:  # ValueError: e.g. an empty label
            self._set_error(f"lookup of {self.host} failed ({str(err) or type(err).__name__})")
            return None
        self.last_resolved = self.last_attempt
        self._set_error("" if answer else f"{self.host} resolves to no address")
        return answer

    def _apply(self, answer: set[str]) -> None:
        present = {r.address: r for r in self.replicas}
        for address in sorted(answer - present.keys()):
            self.pool.add(address, self.name)
        for address, replica in present.items():
            if address in answer:
                self.misses.pop(address, None)
                continue
            self.misses[address] = self.misses.get(address, 0) + 1
            if self.misses[address] >= self.miss_limit:
                del self.misses[address]
                self.pool.remove(replica, f"no longer in the DNS answer for {self.name}")

    def _set_error(self, error: str) -> None:
        if error and error != self.error:
            log.warning("draft discovery %s: %s", self.name, error)
        elif not error and self.error:
            log.info("draft discovery %s: resolves again", self.name)
        self.error = error

    def status(self) -> pb.DraftDiscoveryStatus:
        return pb.DraftDiscoveryStatus(
            name=self.name,
            addresses=sorted(r.address for r in self.replicas),
            last_resolved_unix_s=self.last_resolved,
            last_attempt_unix_s=self.last_attempt,
            error=self.error,
            num_lookups=self.num_lookups,
        )
