"""Draft discovery by DNS (router/discovery.py), without containers.

The resolver is injected (a scripted sequence of DNS answers); the addresses it returns are
real gRPC servers on 127.0.0.1: small draft-like servers (health + GetInfo, no model) and
one that serves only the overall health, as a target would. The pool's real health probe
decides who joins.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from plumbing.grpc_util import add_health_and_reflection_aio
from protos import draft_pb2, draft_pb2_grpc
from router.discovery import DraftDiscovery, NameNotFound, resolve_dns, split_host_port
from router.draft_pool import DraftPool

pytestmark = pytest.mark.timeout(60)
DRAFT_SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftModel"].full_name
NAME = "draft.test:50071"


class InfoOnly(draft_pb2_grpc.DraftModelServicer):
    def __init__(self, tree_tokens: int) -> None:
        self.tree_tokens = tree_tokens

    async def GetInfo(self, request, context):  # noqa: N802
        return draft_pb2.DraftInfo(method="ngram", num_draft_tokens=self.tree_tokens)

    async def Release(self, request, context):  # noqa: N802
        return draft_pb2.ReleaseResponse()  # it holds nothing (the pool sweeps it on admission)


async def start_server(draft: bool, tree_tokens: int = 16) -> tuple[grpc.aio.Server, str]:
    """A draft-like server, or (draft=False) one that is healthy but serves no draft."""
    server = grpc.aio.server()
    names = []
    if draft:
        draft_pb2_grpc.add_DraftModelServicer_to_server(InfoOnly(tree_tokens), server)
        names = [DRAFT_SERVICE]
    await add_health_and_reflection_aio(server, names)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


class ScriptedDns:
    """Answers from a list, one per lookup (the last one repeats); an exception is raised."""

    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.lookups: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        answer = self.answers[min(len(self.lookups) - 1, len(self.answers) - 1)]
        if isinstance(answer, Exception):
            raise answer
        return list(answer)


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """make(draft=True) starts a server and returns its address; all stop on exit."""
    started: list[grpc.aio.Server] = []

    async def make(draft: bool = True, tree_tokens: int = 16) -> str:
        server, address = await start_server(draft, tree_tokens)
        started.append(server)
        return address

    try:
        yield make
    finally:
        await asyncio.gather(*(s.stop(None) for s in started))


def in_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Runs an async test body in a fresh event loop (no pytest plugin needed)."""

    @functools.wraps(test)
    def run(*args, **kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def make_discovery(answers: list, now: list[float] | None = None) -> DraftDiscovery:
    clock = (lambda: now[0]) if now is not None else (lambda: 1000.0)
    pool = DraftPool([], timeout_s=1.0)
    return DraftDiscovery(pool, NAME, interval_s=0.01, resolver=ScriptedDns(answers), clock=clock)


def healthy(d: DraftDiscovery) -> set[str]:
    return {r.address for r in d.pool.healthy}


@in_loop
async def test_a_new_address_joins_after_its_health_check() -> None:
    async with serving() as servers:
        a = await servers()
        d = make_discovery([[a]])
        await d.refresh()
        assert [r.address for r in d.pool.replicas] == [a]
        assert d.pool.assign("r1") is None, "not probed yet: must not take requests"
        await d.pool.probe_once()
        assert healthy(d) == {a}
        assert d.pool.assign("r2").address == a
        assert d.resolver.lookups == [("draft.test", 50071)]


@in_loop
async def test_a_vanished_address_leaves_and_its_requests_move() -> None:
    async with serving() as servers:
        a, b = await servers(), await servers()
        d = make_discovery([[a, b], [a], [a]])
        await d.refresh()
        await d.pool.probe_once()
        assert healthy(d) == {a, b}
        on_b = next(r for r in d.pool.replicas if r.address == b)
        d.pool.assign("x")  # least loaded first: x and y go to different replicas
        d.pool.assign("y")
        moving = set(on_b.request_ids)
        assert len(moving) == 1
        await d.refresh()  # one answer without b: kept (answers flap)
        assert healthy(d) == {a, b}
        await d.refresh()  # the second in a row: b leaves
        assert [r.address for r in d.pool.replicas] == [a]
        assert not on_b.healthy and not on_b.request_ids, "its requests fall back target-only"
        assert "no longer in the DNS answer" in on_b.error
        (rid,) = moving
        assert d.pool.assign(rid).address == a, "the request moves to a replica still there"
        assert d.status().addresses == [a]


@in_loop
async def test_flapping_answers_do_not_churn_the_pool() -> None:
    async with serving() as servers:
        a, b = await servers(), await servers()
        flaps = [[a, b], [a], [a, b], [b], OSError("temporary failure"), [a, b], [a], [b], [a, b]]
        d = make_discovery(flaps)
        await d.refresh()
        await d.pool.probe_once()
        first = {r.address: r for r in d.pool.replicas}
        for _ in flaps[1:]:
            await d.refresh()
            await d.pool.probe_once()
            assert healthy(d) == {a, b}
        assert {r.address: r for r in d.pool.replicas} == first, "same replicas: none re-joined"


@in_loop
async def test_an_address_back_before_its_second_miss_stays_healthy() -> None:
    async with serving() as servers:
        a = await servers()
        d = make_discovery([[a], [], [a], [], [a]])
        await d.refresh()
        await d.pool.probe_once()
        replica = d.pool.replicas[0]
        replica.request_ids.add("kept")
        for _ in range(4):
            await d.refresh()
        assert d.pool.replicas == [replica] and replica.healthy
        assert replica.request_ids == {"kept"}, "a flap must not cost a request its replica"


@in_loop
async def test_a_name_that_does_not_exist_empties_the_pool_and_says_why(caplog) -> None:
    async with serving() as servers:
        a = await servers()
        now = [1000.0]
        d = make_discovery([[a], NameNotFound("Name or service not known")], now)
        await d.refresh()
        await d.pool.probe_once()
        assert d.status().last_resolved_unix_s == 1000.0
        caplog.set_level(logging.WARNING, logger="splitspec.router")
        for t in (1005.0, 1010.0):
            now[0] = t
            await d.refresh()
        assert d.pool.replicas == []
        status = d.status()
        assert "does not resolve" in status.error and "draft.test" in status.error
        assert status.last_attempt_unix_s == 1010.0
        assert status.last_resolved_unix_s == 1000.0, "no answer since"
        assert status.num_lookups == 3 and list(status.addresses) == []
        warnings = [r.getMessage() for r in caplog.records if "does not resolve" in r.getMessage()]
        assert len(warnings) == 1, "logged once, not on every lookup"


@in_loop
async def test_temporary_lookup_failures_keep_the_pool() -> None:
    async with serving() as servers:
        a = await servers()
        d = make_discovery([[a], OSError("EAI_AGAIN"), TimeoutError(), OSError("again")])
        await d.refresh()
        await d.pool.probe_once()
        for _ in range(3):
            await d.refresh()
        assert healthy(d) == {a}
        assert "lookup of draft.test failed" in d.status().error


@in_loop
async def test_a_lookup_that_times_out_says_so(caplog) -> None:
    d = make_discovery([TimeoutError()])
    await d.refresh()
    assert d.status().error == "lookup of draft.test failed (no answer in 5 s)"
    assert "(no answer in 5 s)" in caplog.text  # once said "failed ()"


@in_loop
async def test_an_address_that_is_not_a_draft_never_takes_requests(caplog) -> None:
    async with serving() as servers:
        draft, other = await servers(), await servers(draft=False)
        d = make_discovery([[draft, other]])
        caplog.set_level(logging.WARNING, logger="splitspec.router")
        await d.refresh()
        for _ in range(3):
            await d.pool.probe_once()
        assert healthy(d) == {draft}
        bad = next(r for r in d.pool.replicas if r.address == other)
        assert bad.error.startswith("not a draft service") and "NOT_FOUND" in bad.error
        assert sum("not a draft service" in r.getMessage() for r in caplog.records) == 1
        assert {d.pool.assign(f"r{i}").address for i in range(4)} == {draft}


@in_loop
async def test_a_replica_whose_trees_the_router_would_cut_is_named_once(caplog) -> None:
    """Trees past the router's --max-tree-tokens are cut to their first nodes: said at join."""
    async with serving() as servers:
        big, fits = await servers(tree_tokens=128), await servers(tree_tokens=64)
        pool = DraftPool([big, fits], timeout_s=1.0, max_tree_tokens=64)
        caplog.set_level(logging.WARNING, logger="splitspec.router")
        for _ in range(3):
            await pool.probe_once()
        assert {r.address for r in pool.healthy} == {big, fits}, "still serves: output is exact"
        said = [r.getMessage() for r in caplog.records if "is cut" in r.getMessage()]
        assert len(said) == 1 and big in said[0] and "--max-tree-tokens 128" in said[0]
        await pool.close()


@in_loop
async def test_an_unreachable_address_is_reported() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    d = make_discovery([[closed]])
    await d.refresh()
    await d.pool.probe_once()
    assert d.pool.healthy == [] and "unreachable" in d.pool.replicas[0].error


@in_loop
async def test_run_forever_keeps_looking_up() -> None:
    async with serving() as servers:
        a = await servers()
        d = make_discovery([[], [], [a]])
        task = asyncio.create_task(d.run_forever())
        try:
            while not d.pool.replicas:
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
        assert d.resolver.lookups[:3] == [("draft.test", 50071)] * 3


@in_loop
async def test_the_system_resolver() -> None:
    assert "127.0.0.1:7" in await resolve_dns("localhost", 7)
    try:
        await resolve_dns("no-such-draft.invalid", 7)
    except NameNotFound:
        return
    except socket.gaierror as err:
        if err.errno == socket.EAI_AGAIN:  # e.g. the GPU box, which reaches no DNS server
            pytest.skip("no DNS server answers here (EAI_AGAIN), so no NXDOMAIN to see")
        raise
    pytest.fail("no-such-draft.invalid resolved")


@pytest.mark.parametrize("bad", ["draft", "draft:", ":50071", "draft:http", "draft:70000"])
def test_names_without_a_port_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_host_port(bad)


def test_names_split() -> None:
    assert split_host_port("draft.ns.svc.cluster.local:50071") == (
        "draft.ns.svc.cluster.local",
        50071,
    )
    assert split_host_port("[::1]:9") == ("::1", 9)
