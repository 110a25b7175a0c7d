"""Async client of the target service; every call carries a deadline."""

from __future__ import annotations

import grpc

from protos import target_pb2, target_pb2_grpc
from splitspec.grpc_util import CHANNEL_OPTIONS


class TargetClient:
    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = target_pb2_grpc.TargetModelStub(self.channel)

    async def info(self) -> target_pb2.TargetInfo:
        return await self.stub.GetInfo(target_pb2.GetInfoRequest(), timeout=self.timeout_s)

    async def forward(self, items: list[target_pb2.ForwardItem]) -> target_pb2.ForwardResponse:
        # Not retried: a Forward writes KV and advances per-request state on the target.
        return await self.stub.Forward(target_pb2.ForwardRequest(items=items), timeout=self.timeout_s)

    async def release(self, request_ids: list[str]) -> None:
        if request_ids:
            await self.stub.Release(
                target_pb2.ReleaseRequest(request_ids=request_ids), timeout=self.timeout_s
            )

    async def close(self) -> None:
        await self.channel.close()
