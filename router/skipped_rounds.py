"""Rounds without the drafter: a replica that is skipped (suspected of hanging) is not waited
for. Its requests verify a root-only tree (the target's plain next token, with the root's hidden
row for EAGLE), and the updates the replica missed are merged so it gets them all at once when
it answers again: no re-ingest for a replica that was only slow."""

from __future__ import annotations

from protos import draft_pb2, tensor_pb2
from router.request import Request


def skipped_trees(reqs: list[Request]) -> list[draft_pb2.DraftTree]:
    return [
        draft_pb2.DraftTree(
            request_id=r.request_id, token_ids=[r.output_ids[-1]], parent_indices=[-1]
        )
        for r in reqs
    ]


def merge_updates(
    old: draft_pb2.ContextUpdate, new: draft_pb2.ContextUpdate
) -> draft_pb2.ContextUpdate:
    """``old`` then ``new``, as one update (both are contiguous: new starts where old ends)."""
    if new.start_pos != old.start_pos + len(old.token_ids):
        raise ValueError(f"updates of {old.request_id} do not line up")
    merged = draft_pb2.ContextUpdate(
        request_id=old.request_id,
        start_pos=old.start_pos,
        token_ids=[*old.token_ids, *new.token_ids],
        hidden_start_pos=old.hidden_start_pos,
    )
    if old.HasField("hidden") and new.HasField("hidden"):
        merged.hidden.CopyFrom(concat_rows(old.hidden, new.hidden))
    return merged


def concat_rows(a: tensor_pb2.Tensor, b: tensor_pb2.Tensor) -> tensor_pb2.Tensor:
    """Two [rows, width] tensors of one dtype stacked, on the wire format (no numpy needed)."""
    if a.dtype != b.dtype or list(a.shape[1:]) != list(b.shape[1:]):
        raise ValueError(f"cannot stack {a.dtype}{list(a.shape)} and {b.dtype}{list(b.shape)}")
    return tensor_pb2.Tensor(
        data=a.data + b.data, dtype=a.dtype, shape=[a.shape[0] + b.shape[0], *a.shape[1:]]
    )
