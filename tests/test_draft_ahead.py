"""router/draft_ahead.py: the next round's Propose leaves before `send` returns (so before the
router commits), its trees come back by request id, and requests not ready are not asked for.
The speculation object is a stand-in that records calls: what is under test is the ordering.
Lossless output with the router drafting ahead is pinned by the real-stack speculation tests
(tests/test_spec_lossless.py, tests/test_spec_scripted.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from protos import draft_pb2
from router.draft_ahead import DraftAhead


@dataclass
class Req:
    request_id: str
    synced: bool = True


@dataclass
class RecordingSpec:
    calls: list[list[str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def ready(self, req: Req) -> bool:
        return req.synced

    async def propose(self, reqs: list[Req]) -> dict[str, draft_pb2.DraftTree]:
        self.calls.append([r.request_id for r in reqs])  # the request is on its way
        await self.release.wait()  # the drafter's work
        return {r.request_id: draft_pb2.DraftTree(request_id=r.request_id) for r in reqs}


def test_the_call_leaves_before_send_returns_and_its_trees_are_taken_later() -> None:
    async def scenario() -> None:
        spec = RecordingSpec()
        ahead = DraftAhead(spec)  # type: ignore[arg-type]
        await ahead.send([Req("a"), Req("b", synced=False), Req("c")])
        assert spec.calls == [["a", "c"]]  # sent before the commit would run; b is not ready
        await ahead.send([Req("d")])  # one call at a time: the next step takes the first
        assert spec.calls == [["a", "c"]]
        spec.release.set()
        trees, asked = await ahead.take()
        assert sorted(trees) == ["a", "c"] and asked == {"a", "c"}
        assert await ahead.take() == ({}, set())

    asyncio.run(scenario())


def test_nothing_ready_sends_nothing() -> None:
    async def scenario() -> None:
        spec = RecordingSpec()
        ahead = DraftAhead(spec)  # type: ignore[arg-type]
        await ahead.send([Req("a", synced=False)])
        assert spec.calls == [] and await ahead.take() == ({}, set())

    asyncio.run(scenario())


def test_out_says_whether_a_call_waits_to_be_taken() -> None:
    """The scheduler's cue that a target-only step pays for the last round's Propose (a mode
    change's cost, kept out of the speculation switch's rates)."""

    async def scenario() -> None:
        spec = RecordingSpec()
        ahead = DraftAhead(spec)  # type: ignore[arg-type]
        assert not ahead.out
        await ahead.send([Req("a")])
        assert ahead.out
        spec.release.set()
        assert await ahead.trees([], speculate=False) == {}  # taken, though not speculating
        assert not ahead.out

    asyncio.run(scenario())
