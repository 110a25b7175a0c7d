"""Async client of the target service; every call carries a deadline."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from plumbing.grpc_util import CHANNEL_OPTIONS, RECONNECT_OPTIONS, ROUTER_ID_KEY
from plumbing.rpc_stream import StreamedUnary
from plumbing.security import ClientTLS, aio_channel
from protos import target_pb2, target_pb2_grpc
from router.config import CLAIM_LEASE_S

log = logging.getLogger("splitspec.router")


class TargetClient:
    def __init__(
        self,
        address: str,
        timeout_s: float,
        tls: ClientTLS | None = None,
        name: str = "",
        claim_lease_s: float = CLAIM_LEASE_S,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.claim_lease_s = claim_lease_s
        self.channel = aio_channel(address, tls, [*CHANNEL_OPTIONS, *RECONNECT_OPTIONS])
        self.stub = target_pb2_grpc.TargetModelStub(self.channel)
        # Every call names this router: the target takes one router's calls at a time.
        self.router_id, self.name = uuid.uuid4().hex, name
        self.metadata = ((ROUTER_ID_KEY, self.router_id),)
        # A step's calls, each over a stream of its own (plumbing/rpc_stream.py): a fraction
        # of a unary call's round trip, and a Forward and a Verify may still run together.
        self._forward: StreamedUnary[target_pb2.ForwardRequest, target_pb2.ForwardResponse] = (
            StreamedUnary(functools.partial(self.stub.ForwardStream, metadata=self.metadata))
        )
        self._verify: StreamedUnary[target_pb2.VerifyRequest, target_pb2.VerifyResponse] = (
            StreamedUnary(functools.partial(self.stub.VerifyStream, metadata=self.metadata))
        )

    async def info(self) -> target_pb2.TargetInfo:
        return await self.stub.GetInfo(target_pb2.GetInfoRequest(), timeout=self.timeout_s)

    async def forward(
        self, items: list[target_pb2.ForwardItem], decode_steps: int = 1
    ) -> target_pb2.ForwardResponse:
        # Not retried: a Forward writes KV and advances per-request state on the target.
        return await self._forward(
            target_pb2.ForwardRequest(items=items, decode_steps=decode_steps),
            timeout=self.timeout_s,
        )

    async def verify(self, items: list[target_pb2.VerifyItem]) -> target_pb2.VerifyResponse:
        # Not retried either: compaction moves KV rows in place.
        return await self._verify(target_pb2.VerifyRequest(items=items), timeout=self.timeout_s)

    async def read_hidden(
        self, request_id: str, start: int, end: int
    ) -> AsyncIterator[target_pb2.HiddenChunk]:
        call = self.stub.ReadHidden(
            target_pb2.ReadHiddenRequest(request_id=request_id, start_pos=start, end_pos=end),
            timeout=self.timeout_s,
            metadata=self.metadata,
        )
        async for chunk in call:
            yield chunk

    async def release(self, request_ids: list[str]) -> None:
        if request_ids:
            await self.stub.Release(
                target_pb2.ReleaseRequest(request_ids=request_ids),
                timeout=self.timeout_s,
                metadata=self.metadata,
            )

    def abort_calls(self, why: str) -> None:
        """Ends the step's Forward and Verify in flight with UNAVAILABLE (``why``): a target
        found lost while hung would otherwise keep them, and their requests' clients, waiting
        for the call's deadline (60 s and more after a SIGSTOP)."""
        self._forward.abort(why)
        self._verify.abort(why)

    async def release_orphans(self, when: str) -> int:
        """Drops every request the target holds; ``when`` says why none can be ours. The router
        owns its target, so what it holds then was left by a router that died (or by calls lost
        with the target): kept, those requests held their rows for good, and once the rows ran
        out every new request failed RESOURCE_EXHAUSTED."""
        request = target_pb2.ReleaseRequest(all=True)
        reply = await self.stub.Release(request, timeout=self.timeout_s, metadata=self.metadata)
        released = reply.num_released
        if released:
            log.warning("the target held %d requests no router serves (%s): released",
                        released, when)  # fmt: skip
        return released

    async def claim(self) -> None:
        """Makes this router the target's, or renews its claim; FAILED_PRECONDITION while
        another router's claim is live (its details name that router)."""
        request = target_pb2.ClaimRequest(
            router_id=self.router_id, router_name=self.name, lease_s=self.claim_lease_s
        )
        await self.stub.Claim(request, timeout=min(self.timeout_s, 2.0))

    async def give_up(self) -> None:
        """Hands the target over at once, for a router that stops: the next need not wait for
        the claim to lapse. Best effort: a claim not given up lapses anyway."""
        request = target_pb2.ClaimRequest(router_id=self.router_id, give_up=True)
        try:
            await self.stub.Claim(request, timeout=2.0)
        except grpc.aio.AioRpcError as err:
            log.warning("could not hand the target over (%s): it is free in %.0f s",
                        err.code().name, self.claim_lease_s)  # fmt: skip

    async def close(self) -> None:
        self._forward.close()
        self._verify.close()
        await self.channel.close()
