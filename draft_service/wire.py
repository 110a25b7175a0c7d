"""Propose and Ingest messages to the engine's types and back."""

from __future__ import annotations

from draft_service.drafter import ContextChunk
from draft_service.errors import InvalidDraftInput
from draft_service.tree_types import DraftTree
from model_runtime.wire import tensor_from_pb
from protos import draft_pb2


def chunk_from_pb(update: draft_pb2.ContextUpdate) -> ContextChunk:
    if not update.request_id:
        raise InvalidDraftInput("update without request_id")
    token_ids = list(update.token_ids)
    if any(t < 0 for t in token_ids):
        raise InvalidDraftInput(f"request {update.request_id!r}: negative token id")
    hidden = None
    if update.HasField("hidden"):
        try:
            hidden = tensor_from_pb(update.hidden)
        except ValueError as err:
            raise InvalidDraftInput(f"request {update.request_id!r}: hidden: {err}") from err
        if hidden.dim() != 2:
            raise InvalidDraftInput(
                f"request {update.request_id!r}: hidden must be "
                f"[rows, hidden_size], got shape {tuple(hidden.shape)}"
            )
        hidden = hidden if hidden.shape[0] else None
    return ContextChunk(
        update.request_id, update.start_pos, token_ids, update.hidden_start_pos, hidden
    )


def tree_to_pb(request_id: str, tree: DraftTree | None) -> draft_pb2.DraftTree:
    if tree is None:
        return draft_pb2.DraftTree(request_id=request_id, needs_context=True)
    return draft_pb2.DraftTree(
        request_id=request_id,
        token_ids=tree.token_ids,
        parent_indices=tree.parent_indices,
        scores=tree.scores or [],
    )
