"""The prompt-lookup drafter behind the `Drafter` interface (method "ngram").

`NgramDrafter` indexes whole contexts and knows nothing of positions; this adapter adds the
position bookkeeping the draft service contract needs: a chunk must start exactly where the held
context ends (or at 0 for a request not held), otherwise it raises ContextMismatch and leaves
the held state as it was. Hidden rows are ignored (needs_hidden is False).
"""

from __future__ import annotations

from collections.abc import Sequence

from draft_service.drafter import ContextChunk, ContextMismatch, Drafter, TreeShape
from draft_service.ngram import NgramDrafter
from draft_service.tree_types import DraftTree


def check_continues(chunk: ContextChunk, num_held: int | None) -> None:
    """Raises ContextMismatch unless `chunk` continues a context of `num_held` tokens.

    `num_held` is None when the request is not held: only a chunk at position 0 may start it.
    """
    if num_held is None:
        if chunk.start_pos != 0:
            raise ContextMismatch(
                f"request {chunk.request_id!r} is not held; its first update must start at 0, "
                f"got start_pos {chunk.start_pos}"
            )
    elif chunk.start_pos != num_held:
        raise ContextMismatch(
            f"request {chunk.request_id!r} holds {num_held} tokens; "
            f"update starts at {chunk.start_pos}"
        )


class NgramContextDrafter(Drafter):
    """Prompt lookup with per-request positions.

    TreeShape maps onto NgramDrafter as: num_draft_tokens -> num_draft_tokens (root included in
    both), num_steps -> max_depth, topk -> max_breadth. A request may be held with zero tokens
    (an Ingest whose first chunk carries only hidden rows); `propose` needs at least one.
    """

    method = "ngram"
    needs_hidden = False

    def __init__(self, shape: TreeShape, min_ngram: int = 1, max_ngram: int = 4) -> None:
        self.shape = shape
        self._ngram = NgramDrafter(
            min_ngram=min_ngram,
            max_ngram=max_ngram,
            num_draft_tokens=shape.num_draft_tokens,
            max_breadth=shape.topk,
            max_depth=shape.num_steps,
        )
        self._num_tokens: dict[str, int] = {}  # presence means "held", even with 0 tokens

    def append(self, chunk: ContextChunk) -> None:
        request_id = chunk.request_id
        num_held = self._num_tokens.get(request_id)
        check_continues(chunk, num_held)
        token_ids = list(chunk.token_ids)
        if token_ids:
            # NgramDrafter cannot hold an empty context, so it starts at the first real tokens.
            if request_id in self._ngram:
                self._ngram.extend(request_id, token_ids)
            else:
                self._ngram.start(request_id, token_ids)
        self._num_tokens[request_id] = (num_held or 0) + len(token_ids)

    def propose(self, request_ids: Sequence[str]) -> list[DraftTree]:
        for request_id in request_ids:
            if self.num_tokens(request_id) == 0:
                raise ContextMismatch(f"request {request_id!r} holds no tokens to root a tree")
        return [self._ngram.propose(request_id) for request_id in request_ids]

    def release(self, request_id: str) -> bool:
        self._ngram.drop(request_id)
        return self._num_tokens.pop(request_id, None) is not None

    def held_ids(self) -> list[str]:
        return list(self._num_tokens)

    def num_tokens(self, request_id: str) -> int:
        return self._num_tokens.get(request_id, 0)
