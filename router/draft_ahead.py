"""The drafting side of a router step: the trees it verifies, and the next round's Propose,
sent as soon as a Verify's reply is in, before the router commits and streams what it accepted.

A round's Propose carries what the last Verify committed (router/speculation.py `after_verify`)
and nothing the commit decides, so it can leave before the commit: the drafter then works while
the router applies stop rules, detokenizes, streams and finishes requests, instead of after.
The trees are the ones the next step would have asked for, from the same update and round
number, so nothing about the output changes. The next step takes the trees (awaiting the call
if it is still out) for the requests it speculates for and proposes for the others as before.

What the call can cost: a request that the commit ends (EOS, a stop string) was drafted for in
vain, once; a request that reaches its length limit in the block is not drafted for. A step
that does not speculate still takes the call, so its replies keep the requests' draft state
in line (their update was delivered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from protos import draft_pb2, target_pb2
from router.request import Request
from router.speculation import Speculation


class DraftAhead:
    def __init__(self, spec: Speculation) -> None:
        self.spec = spec
        self._call: asyncio.Task | None = None
        self._asked: set[str] = set()

    async def trees(
        self, decoding: list[Request], speculate: bool
    ) -> dict[str, draft_pb2.DraftTree]:
        """A step's trees for its decoding requests: those drafted ahead, and a Propose now
        for the ready ones that were not among them. The call out is taken even when the
        step does not speculate: its replies keep the requests' draft state in line."""
        ahead, asked = await self.take()
        if not speculate:
            return {}
        ready = [r for r in decoding if self.spec.ready(r)]
        trees = {r.request_id: ahead[r.request_id] for r in ready if r.request_id in ahead}
        rest = [r for r in ready if r.request_id not in asked]
        return trees | (await self.spec.propose(rest) if rest else {})

    async def after_verify(
        self,
        verify: list[tuple[Request, draft_pb2.DraftTree]],
        items: list[target_pb2.VerifyItem],
        results: list[target_pb2.VerifyResult],
        forced: Collection[str] = (),
    ) -> None:
        """Each verified request's update for its drafter, then the next round's Propose on
        its way for those whose block cannot reach their length. The ``forced`` ids' trees
        were their formats' alone (router/forced_steps.py): no drafter had a part."""
        going_on = []
        for (req, _), item, result in zip(verify, items, results, strict=True):
            if req.request_id in forced:
                self.spec.after_forced(req, result, len(item.token_ids))
                continue
            self.spec.after_verify(req, result, len(item.token_ids))
            if len(result.token_ids) < req.options.max_new_tokens - len(req.output_ids):
                going_on.append(req)
        await self.send(going_on)

    async def send(self, reqs: list[Request]) -> None:
        """Proposes for ``reqs`` in the background; returns once the call is on its way."""
        ready = [r for r in reqs if self.spec.ready(r)]
        if not ready or self._call is not None:
            return
        self._asked = {r.request_id for r in ready}
        self._call = asyncio.create_task(self.spec.propose(ready))
        await asyncio.sleep(0)  # the task's turn: it writes the request before the commit runs

    @property
    def out(self) -> bool:
        """Whether a Propose sent ahead is still to be taken."""
        return self._call is not None

    async def take(self) -> tuple[dict[str, draft_pb2.DraftTree], set[str]]:
        """The trees proposed ahead, by request id, and the ids that were asked for."""
        if self._call is None:
            return {}, set()
        call, asked = self._call, self._asked
        self._call, self._asked = None, set()
        return await call, asked
