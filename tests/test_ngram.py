"""Tests for the prompt-lookup drafter and the DraftTree invariants (pure Python, no device)."""

from __future__ import annotations

import random

import pytest

from draft_service.ngram import NgramDrafter
from draft_service.tree_types import DraftTree


def first_chain(tree: DraftTree) -> list[int]:
    """Tokens along the path that always takes the first-listed (best) child."""
    chain: list[int] = []
    node = 0
    while True:
        children = [i for i, p in enumerate(tree.parent_indices) if p == node]
        if not children:
            return chain
        node = children[0]
        chain.append(tree.token_ids[node])


def children_tokens(tree: DraftTree, node: int) -> list[int]:
    return [tree.token_ids[i] for i, p in enumerate(tree.parent_indices) if p == node]


def node_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Draft tokens from the root (exclusive) to each node; the root's path is empty."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.num_nodes):
        paths.append(paths[tree.parent_indices[i]] + (tree.token_ids[i],))
    return paths


def reference_candidates(tokens: list[int], drafter: NgramDrafter) -> list[list[int]]:
    """Brute-force spec: the continuations of the longest earlier suffix match, periodic."""
    length = len(tokens)
    for n in range(min(drafter.max_ngram, length), drafter.min_ngram - 1, -1):
        suffix = tokens[length - n :]
        starts = [q for q in range(n, length) if tokens[q - n : q] == suffix]
        if starts:
            starts = starts[-drafter.max_matches_per_ngram :]
            return [
                [tokens[s + k % (length - s)] for k in range(drafter.max_depth)] for s in starts
            ]
    return []


def check_tree(tree: DraftTree, drafter: NgramDrafter, tokens: list[int]) -> None:
    """Every property a proposal must have, checked against the brute-force reference."""
    tree.validate()
    assert tree.token_ids[0] == tokens[-1]
    assert tree.num_nodes <= drafter.num_draft_tokens
    assert tree.depth <= drafter.max_depth
    for node in range(tree.num_nodes):
        assert len(children_tokens(tree, node)) <= drafter.max_breadth
    assert tree.scores is not None
    for i in range(1, tree.num_nodes):
        assert 0.0 < tree.scores[i] <= tree.scores[tree.parent_indices[i]]
    candidates = reference_candidates(tokens, drafter)
    for path, score in zip(node_paths(tree), tree.scores, strict=True):
        agreeing = sum(1 for c in candidates if tuple(c[: len(path)]) == path)
        assert path == () or agreeing > 0, f"path {path} is not a continuation"
        if path:
            assert score == pytest.approx(agreeing / len(candidates))
    if drafter.num_draft_tokens > 1:
        assert (tree.num_nodes > 1) == bool(candidates)


def test_repeated_text_drafts_the_obvious_continuation() -> None:
    drafter = NgramDrafter()
    tokens = [1, 2, 3, 4, 5] * 3 + [1, 2]
    drafter.start("r", tokens)
    tree = drafter.propose("r")
    check_tree(tree, drafter, tokens)
    assert tree.token_ids[0] == 2
    assert first_chain(tree) == [3, 4, 5, 1, 2, 3, 4]
    assert tree.num_nodes == drafter.num_draft_tokens


def test_short_period_loop_drafts_full_depth() -> None:
    drafter = NgramDrafter(num_draft_tokens=9, max_depth=8)
    drafter.start("r", [5, 6, 7, 7, 7])
    assert first_chain(drafter.propose("r")) == [7] * 8


def test_distinct_continuations_branch_most_recent_first() -> None:
    drafter = NgramDrafter(num_draft_tokens=16, max_depth=2)
    tokens = [9, 1, 2, 9, 1, 3, 9, 1, 4, 9, 1]
    drafter.start("r", tokens)
    tree = drafter.propose("r")
    check_tree(tree, drafter, tokens)
    assert children_tokens(tree, 0) == [4, 3, 2]
    assert tree.num_nodes == 7 and all(children_tokens(tree, i) == [9] for i in (1, 2, 3))


def test_frequent_continuation_beats_recent_one() -> None:
    drafter = NgramDrafter(max_ngram=2, num_draft_tokens=16)
    tokens = [7, 5, 8, 7, 5, 8, 7, 5, 6, 7, 5]
    drafter.start("r", tokens)
    tree = drafter.propose("r")
    check_tree(tree, drafter, tokens)
    assert children_tokens(tree, 0) == [8, 6]
    assert tree.scores is not None
    assert tree.scores[1:3] == pytest.approx([2 / 3, 1 / 3])


def test_longest_ngram_wins() -> None:
    drafter = NgramDrafter(max_ngram=3)
    # (1,) alone is followed by 2 and by 3; the 3-gram (0, 0, 1) was followed only by 3.
    tokens = [1, 2, 0, 0, 1, 3, 1, 2, 0, 0, 1]
    drafter.start("r", tokens)
    tree = drafter.propose("r")
    check_tree(tree, drafter, tokens)
    assert children_tokens(tree, 0) == [3]


def test_no_match_gives_root_only_tree() -> None:
    drafter = NgramDrafter()
    drafter.start("r", [1, 2, 3, 4])
    tree = drafter.propose("r")
    tree.validate()
    assert tree.token_ids == [4] and tree.parent_indices == [-1] and tree.depth == 0


@pytest.mark.parametrize(
    ("num_draft_tokens", "max_breadth", "max_depth"),
    [(1, 4, 8), (2, 1, 1), (8, 1, 8), (8, 2, 2), (16, 3, 4), (32, 4, 8), (64, 8, 3)],
)
def test_limits_are_respected(num_draft_tokens: int, max_breadth: int, max_depth: int) -> None:
    rng = random.Random(7)
    tokens = [rng.randrange(3) for _ in range(400)]
    drafter = NgramDrafter(
        min_ngram=1,
        max_ngram=1,
        num_draft_tokens=num_draft_tokens,
        max_breadth=max_breadth,
        max_depth=max_depth,
        max_matches_per_ngram=1000,
    )
    drafter.start("r", tokens)
    tree = drafter.propose("r")
    check_tree(tree, drafter, tokens)
    capacity = sum(min(max_breadth, 3) ** d for d in range(max_depth + 1))
    # ~130 random continuations over a 3-token vocabulary cover every short path: the budget fills.
    assert tree.num_nodes == min(num_draft_tokens, capacity)


def test_random_sequences_always_give_valid_trees() -> None:
    rng = random.Random(1234)
    for trial in range(300):
        request_id = f"req-{trial}"
        drafter = NgramDrafter(
            min_ngram=rng.randint(1, 3),
            max_ngram=rng.randint(3, 5),
            num_draft_tokens=rng.randint(1, 24),
            max_breadth=rng.randint(1, 5),
            max_depth=rng.randint(1, 10),
            max_matches_per_ngram=rng.randint(1, 8),
        )
        vocab = rng.randint(1, 6)
        tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        drafter.start(request_id, tokens)
        for _ in range(rng.randint(1, 8)):
            check_tree(drafter.propose(request_id), drafter, tokens)
            new_tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 6))]
            drafter.extend(request_id, new_tokens)
            tokens = tokens + new_tokens
        check_tree(drafter.propose(request_id), drafter, tokens)
        drafter.drop(request_id)
    assert len(drafter) == 0


def test_extend_after_propose_uses_new_tokens() -> None:
    drafter = NgramDrafter()
    drafter.start("r", [1, 2, 3, 1, 2])
    assert first_chain(drafter.propose("r"))[:1] == [3]
    drafter.extend("r", [3])
    tree = drafter.propose("r")
    assert tree.token_ids[0] == 3
    assert first_chain(tree)[:3] == [1, 2, 3]
    drafter.extend("r", [8, 9, 1, 2])  # the most recent "1 2" is now followed by nothing yet
    drafter.extend("r", [8])
    tree = drafter.propose("r")
    check_tree(tree, drafter, [1, 2, 3, 1, 2, 3, 8, 9, 1, 2, 8])
    assert first_chain(tree)[:1] == [9]


def test_drop_frees_state() -> None:
    drafter = NgramDrafter()
    drafter.start("a", [1, 2, 1])
    drafter.start("b", [3, 3])
    assert "a" in drafter and len(drafter) == 2
    drafter.drop("a")
    assert "a" not in drafter and len(drafter) == 1
    with pytest.raises(KeyError):
        drafter.propose("a")
    with pytest.raises(KeyError):
        drafter.extend("a", [1])
    drafter.drop("a")  # idempotent
    drafter.start("a", [4])  # the id may be reused after a drop
    assert drafter.propose("a").token_ids == [4]


def test_requests_are_independent() -> None:
    drafter = NgramDrafter()
    drafter.start("a", [1, 2, 1])
    drafter.start("b", [1, 5, 1])
    assert first_chain(drafter.propose("a"))[:1] == [2]
    assert first_chain(drafter.propose("b"))[:1] == [5]


def test_bad_arguments_raise() -> None:
    for kwargs in (
        {"min_ngram": 0},
        {"min_ngram": 3, "max_ngram": 2},
        {"num_draft_tokens": 0},
        {"max_breadth": 0},
        {"max_depth": 0},
        {"max_matches_per_ngram": 0},
    ):
        with pytest.raises(ValueError):
            NgramDrafter(**kwargs)
    drafter = NgramDrafter()
    with pytest.raises(ValueError):
        drafter.start("r", [])
    drafter.start("r", [1])
    with pytest.raises(ValueError):
        drafter.start("r", [1])


def test_long_context_runs() -> None:
    rng = random.Random(0)
    drafter = NgramDrafter(num_draft_tokens=16)
    tokens = [rng.randrange(50) for _ in range(20_000)]
    drafter.start("r", tokens)
    for _ in range(200):
        tree = drafter.propose("r")
        tree.validate()
        drafter.extend("r", tree.token_ids[1:2] or [rng.randrange(50)])
    index = drafter._contexts["r"].index
    assert max(len(starts) for starts in index.values()) <= drafter.max_matches_per_ngram


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        (DraftTree([], []), "at least the root"),
        (DraftTree([1, 2], [-1]), "parent_indices"),
        (DraftTree([1], [0]), "root parent"),
        (DraftTree([1, 2, 3], [-1, 2, 0]), "precede"),
        (DraftTree([1, 2, 2], [-1, 0, 0]), "duplicates"),
        (DraftTree([1, -2], [-1, 0]), "negative"),
        (DraftTree([1, 2], [-1, 0], [1.0]), "scores"),
        (DraftTree([1, 2], [-1, 0], [0.5, 0.5]), "root score"),
        (DraftTree([1, 2], [-1, 0], [1.0, 1.5]), "outside"),
    ],
)
def test_draft_tree_validate_rejects(tree: DraftTree, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tree.validate()


def test_draft_tree_helpers() -> None:
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3], [1.0, 0.6, 0.4, 0.6, 0.3])
    tree.validate()
    assert tree.num_nodes == 5 and tree.depth == 3
    assert tree.node_depths() == [0, 1, 1, 2, 3]
    assert DraftTree.root_only(3).depth == 0
