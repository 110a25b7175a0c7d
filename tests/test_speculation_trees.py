"""router/speculation.py's tree check: a drafter's tree is verified as sent (cut to what fits)
when well formed, and replaced by the root alone otherwise, never failing the step."""

from __future__ import annotations

import random

import pytest

from protos import draft_pb2
from router.draft_pool import DraftPool
from router.request import Request, SamplingOptions
from router.speculation import Speculation

VOCAB = 100
ROOT = 42  # the request's last committed token: every verified tree's root


def speculation(max_tree_tokens: int = 64) -> Speculation:
    return Speculation(
        DraftPool([], 1.0), None, None,  # type: ignore[arg-type]
        default_on=True, max_tree_tokens=max_tree_tokens, vocab_size=VOCAB,
        max_context=4096, max_verify_tokens=4096,
    )  # fmt: skip


def request() -> Request:
    req = Request("r", [1, 2, 3], SamplingOptions(max_new_tokens=8))
    req.output_ids = [ROOT]
    return req


def tree(tokens: list[int], parents: list[int]) -> draft_pb2.DraftTree:
    return draft_pb2.DraftTree(request_id="r", token_ids=tokens, parent_indices=parents)


def expected(tokens: list[int], parents: list[int], size: int) -> tuple[list[int], list[int]]:
    """The rule, node by node."""
    tokens, parents = tokens[:size], parents[:size]
    ok = (
        len(tokens) == len(parents) == size
        and parents[0] == -1
        and all(0 <= p < i for i, p in enumerate(parents) if i)
        and all(0 <= t < VOCAB for t in tokens)
    )
    return ([ROOT, *tokens[1:]], parents) if ok else ([ROOT], [-1])


@pytest.mark.parametrize(
    ("tokens", "parents", "ok"),
    [
        ([7, 8, 9, 10], [-1, 0, 0, 2], True),
        ([7], [-1], True),
        ([7, 8, 9], [-1, 0, 2], False),  # its own parent
        ([7, 8, 9], [-1, 2, 0], False),  # a parent after its child
        ([7, 8, 9], [-1, 0, -1], False),  # a second root
        ([7, 8, 9], [0, 0, 1], False),  # a root with a parent
        ([7, 8, VOCAB], [-1, 0, 1], False),  # a token outside the vocabulary
        ([7, -3, 9], [-1, 0, 1], False),
        ([7, 8, 9], [-1, 0], False),  # fewer parents than tokens
        ([], [-1], False),  # parents without tokens
        ([], [], False),
    ],
)
def test_malformed_trees_become_the_root_alone(
    tokens: list[int], parents: list[int], ok: bool
) -> None:
    got = speculation()._sanitize(request(), tree(tokens, parents), room=64)
    want = ([ROOT, *tokens[1:]], parents) if ok else ([ROOT], [-1])
    assert got == want


def test_trees_are_cut_to_the_room_and_the_tree_limit() -> None:
    tokens, parents = [5, 6, 7, 8, 9], [-1, 0, 1, 1, 3]
    assert speculation()._sanitize(request(), tree(tokens, parents), room=3) == (
        [ROOT, 6, 7],
        [-1, 0, 1],
    )
    assert speculation(max_tree_tokens=2)._sanitize(request(), tree(tokens, parents), room=64) == (
        [ROOT, 6],
        [-1, 0],
    )


def test_random_trees_follow_the_node_by_node_rule() -> None:
    rnd = random.Random(0)
    spec = speculation(max_tree_tokens=16)
    for _ in range(2000):
        size = rnd.randrange(1, 24)
        tokens = [rnd.randrange(-2, VOCAB + 2) if rnd.random() < 0.05 else rnd.randrange(VOCAB)
                  for _ in range(size)]  # fmt: skip
        parents = [-1] + [rnd.randrange(-1, i + 1) if rnd.random() < 0.05 else rnd.randrange(i)
                          for i in range(1, size)]  # fmt: skip
        if rnd.random() < 0.05:
            parents = parents[: rnd.randrange(size)]
        room = rnd.randrange(1, 24)
        got = spec._sanitize(request(), tree(tokens, parents), room=room)
        assert got == expected(tokens, parents, max(1, min(size, 16, room)))
