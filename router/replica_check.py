"""What the pool's probe asks of a draft replica before it serves (router/draft_pool.py).

Its health, asked by the draft service's name (which tells a draft from any other gRPC server);
its DraftInfo, which must fit the target (an EAGLE head for another model does not); and, before
it first serves, that it drop what a router that died left there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos import draft_pb2, target_pb2

if TYPE_CHECKING:
    from router.draft_pool import DraftReplica

log = logging.getLogger("splitspec.router")
DRAFT_SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftModel"].full_name
MISFIT = "built for another target"  # how GetServerStatus says so (the launcher looks for it)
FIT_HINT = "give the draft the target's --model and a head trained for it"


async def health_error(channel: grpc.aio.Channel) -> str:
    """Why the health check failed ("" if it passed)."""
    stub = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service=DRAFT_SERVICE)
    try:
        reply = await stub.Check(request, timeout=1.0)
    except grpc.aio.AioRpcError as err:
        if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
            return f"not a draft service (health of {DRAFT_SERVICE}: {err.code().name})"
        return f"unreachable ({err.code().name})"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return f"draft service not serving ({status})"
    return ""


async def admission_error(
    replica: DraftReplica, target: target_pb2.TargetInfo | None, max_tree_tokens: int
) -> str:
    """What keeps the replica from serving drafts ("" for nothing); ``target`` None: its fit
    is not checked."""
    error = await health_error(replica.channel)
    if error:
        return error
    try:
        replica.info = await replica.stub.GetInfo(draft_pb2.GetInfoRequest(), timeout=2.0)
        misfit = draft_misfit(replica.info, target) if target else ""
        if misfit:
            return f"{MISFIT}: {misfit}"
        warn_if_trees_are_cut(replica, max_tree_tokens)
        if not replica.swept:
            await release_orphans(replica)
        await flush_releases(replica)
    except grpc.aio.AioRpcError as err:
        return f"GetInfo or Release failed ({err.code().name})"
    return ""


def draft_misfit(draft: draft_pb2.DraftInfo, target: target_pb2.TargetInfo) -> str:
    """Why a replica cannot draft for this target ("" if it can). An EAGLE head built for
    another model was kept in rotation before: each step's Ingest was refused (a wasted call and
    an error line a request a step) and the replica read healthy while nothing was drafted."""
    if draft.needs_hidden and draft.hidden_size and draft.hidden_size != target.hidden_size:
        what = f"it reads hidden rows of width {draft.hidden_size}, the target's are"
        return f"{what} {target.hidden_size} ({FIT_HINT})"
    if draft.vocab_size and draft.vocab_size != target.vocab_size:
        what = f"its vocabulary has {draft.vocab_size} tokens, the target's"
        return f"{what} {target.vocab_size} ({FIT_HINT})"
    return ""


def warn_if_trees_are_cut(replica: DraftReplica, max_tree_tokens: int) -> None:
    size = replica.info.num_draft_tokens if replica.info else 0
    if max_tree_tokens and size > max_tree_tokens and not replica.warned_cut:
        replica.warned_cut = True
        log.warning(
            "draft replica %s proposes trees of up to %d nodes, but the router verifies at "
            "most %d (--max-tree-tokens, capped by the target's): each tree is cut to its "
            "first %d nodes, which loses acceptance; give the router and the target "
            "--max-tree-tokens %d, or the drafter a smaller --num-draft-tokens",
            replica.address, size, max_tree_tokens, max_tree_tokens, size,
        )  # fmt: skip


async def release_orphans(replica: DraftReplica) -> None:
    """Before a replica first serves (no request of ours is there yet): contexts left by a
    router that died would hold its pool for good."""
    reply = await replica.stub.Release(draft_pb2.ReleaseRequest(all=True), timeout=2.0)
    replica.swept = True
    if reply.num_released:
        log.warning("draft replica %s held %d contexts no router serves: released",
                    replica.address, reply.num_released)  # fmt: skip


async def flush_releases(replica: DraftReplica) -> None:
    """The releases it could not take while out of rotation."""
    if replica.pending_releases:
        ids = sorted(replica.pending_releases)
        await replica.stub.Release(draft_pb2.ReleaseRequest(request_ids=ids), timeout=2.0)
        replica.pending_releases.difference_update(ids)
