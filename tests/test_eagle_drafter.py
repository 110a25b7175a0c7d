"""EAGLE drafter against a brute-force reference: full recompute per tree node, naive EAGLE-2."""

from __future__ import annotations

import pytest
import torch

from draft_service.drafter import ContextChunk, ContextMismatch, TreeShape
from draft_service.eagle.drafter import DraftPoolFull, EagleDrafter
from draft_service.eagle.factory import warm_up_eager_appends
from draft_service.eagle.head import EagleHead
from draft_service.tree_types import DraftTree
from tests.test_eagle_head import run_sequence, tiny_head

VOCAB, HIDDEN = 101, 32
SHAPES = [
    TreeShape(4, 3, 12),
    TreeShape(3, 2, 16),
    TreeShape(5, 1, 6),
    TreeShape(1, 4, 3),
    TreeShape(2, 5, 40),
]
Context = tuple[list[int], torch.Tensor]


@pytest.fixture(scope="module")
def head() -> EagleHead:
    return tiny_head(seed=1, dtype=torch.float64)


def make_context(length: int, seed: int) -> Context:
    """Tokens x_0..x_L and target rows h_0..h_{L-1} (L = length)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (length + 1,), generator=gen).tolist()
    return tokens, torch.randn(length, HIDDEN, generator=gen, dtype=torch.float64)


def ingest(drafter: EagleDrafter, rid: str, ctx: Context, cuts: list[int] | None = None) -> None:
    """Appends a context in chunks cut at ``cuts`` (token cuts; rows cut one later)."""
    tokens, hidden = ctx
    bounds = [0, *(cuts or []), len(tokens)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        rows = hidden[max(lo - 1, 0) : max(hi - 1, 0)]
        drafter.append(ContextChunk(rid, lo, tokens[lo:hi], max(lo - 1, 0), rows))


# ---- the brute-force reference ------------------------------------------------------------


class Reference:
    """EAGLE-2 re-implemented naively: every node's feature recomputed over the whole sequence
    (context pairs + its path) without any KV reuse; selection by plain Python sorting."""

    def __init__(self, head: EagleHead, ctx: Context, shape: TreeShape) -> None:
        self.head, self.shape = head, shape
        self.tokens, self.hidden = ctx
        self._features: dict[tuple[int, ...], torch.Tensor] = {}

    def feature(self, path: tuple[int, ...]) -> torch.Tensor:
        """Head output at the last pair of context + path (predicts the path's children)."""
        if path not in self._features:
            parent_features = [self.feature(path[:j]) for j in range(len(path))]
            hidden = torch.cat([self.hidden, *(f[None] for f in parent_features)])
            token_ids = torch.tensor(self.tokens[1:] + list(path))
            self._features[path] = run_sequence(self.head, token_ids, hidden)[-1]
        return self._features[path]

    def children(self, path: tuple[int, ...]) -> list[tuple[int, float]]:
        with torch.inference_mode():
            probs = torch.softmax(self.head.logits(self.feature(path)), dim=-1)
        p, ids = probs.topk(self.shape.topk)
        return list(zip(ids.tolist(), p.tolist(), strict=True))

    def tree(self) -> DraftTree:
        k = self.shape.topk
        level = [((tok,), p) for tok, p in self.children(())]
        candidates, frontier = list(level), level
        for _ in range(self.shape.num_steps - 1):
            kids = [(path + (t,), s * p) for path, s in frontier for t, p in self.children(path)]
            candidates += kids
            frontier = sorted(kids, key=lambda c: -c[1])[:k]
        order = sorted(range(len(candidates)), key=lambda i: -candidates[i][1])
        keep = sorted(order[: self.shape.num_draft_tokens - 1])
        index = {(): 0}
        tokens, parents, scores = [self.tokens[-1]], [-1], [1.0]
        for i in keep:
            path, score = candidates[i]
            index[path] = len(tokens)
            tokens.append(path[-1])
            parents.append(index[path[:-1]])
            scores.append(score)
        return DraftTree(tokens, parents, scores)


def assert_same_tree(got: DraftTree, want: DraftTree) -> None:
    assert got.token_ids == want.token_ids
    assert got.parent_indices == want.parent_indices
    assert got.scores is not None and want.scores is not None
    torch.testing.assert_close(torch.tensor(got.scores), torch.tensor(want.scores))


def check_shape(tree: DraftTree, shape: TreeShape, root: int) -> None:
    tree.validate()
    assert tree.token_ids[0] == root
    assert tree.num_nodes <= shape.num_draft_tokens
    assert tree.depth <= shape.num_steps
    for node in range(tree.num_nodes):
        assert tree.parent_indices.count(node) <= shape.topk
    assert tree.scores is not None
    for i in range(1, tree.num_nodes):
        assert tree.scores[i] <= tree.scores[tree.parent_indices[i]]


# ---- tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_proposal_equals_brute_force_reference(head: EagleHead, shape: TreeShape) -> None:
    drafter = EagleDrafter(head, shape, num_slots=256)
    for seed, length in enumerate([1, 9, 30]):
        ctx = make_context(length, seed)
        ingest(drafter, f"r{seed}", ctx)
        tree = drafter.propose([f"r{seed}"])[0]
        check_shape(tree, shape, ctx[0][-1])
        assert_same_tree(tree, Reference(head, ctx, shape).tree())


def test_topk_one_is_a_chain(head: EagleHead) -> None:
    drafter = EagleDrafter(head, TreeShape(num_steps=5, topk=1, num_draft_tokens=8), 64)
    ingest(drafter, "a", make_context(12, 3))
    tree = drafter.propose(["a"])[0]
    assert tree.parent_indices == [-1, 0, 1, 2, 3, 4]


@pytest.mark.parametrize("cuts", [[1], [2, 3, 4], [5, 11, 12, 20], list(range(1, 25))])
def test_chunked_ingest_equals_one_chunk(head: EagleHead, cuts: list[int]) -> None:
    shape = TreeShape(4, 3, 12)
    ctx = make_context(24, 7)
    whole, chunked = EagleDrafter(head, shape, 64), EagleDrafter(head, shape, 64)
    ingest(whole, "a", ctx)
    ingest(chunked, "a", ctx, cuts)
    assert_same_tree(chunked.propose(["a"])[0], whole.propose(["a"])[0])


def test_uneven_tokens_and_rows(head: EagleHead) -> None:
    """All tokens first, then rows in pieces: pairs run as soon as both halves are held."""
    shape = TreeShape(3, 2, 8)
    tokens, hidden = make_context(10, 8)
    drafter = EagleDrafter(head, shape, 64)
    drafter.append(ContextChunk("a", 0, tokens))
    assert not drafter.is_ready("a") and drafter.pool.num_free == 64
    for lo, hi in [(0, 3), (3, 4), (4, 10)]:
        drafter.append(ContextChunk("a", len(tokens), [], lo, hidden[lo:hi]))
    assert drafter.pool.num_free == 54 and drafter.num_hidden_rows("a") == 10
    assert_same_tree(drafter.propose(["a"])[0], Reference(head, (tokens, hidden), shape).tree())


def test_rounds_with_accepted_tokens_match_a_fresh_ingest(head: EagleHead) -> None:
    """Tree scratch KV never leaks into the context: extend after propose == ingest anew."""
    shape = TreeShape(4, 3, 12)
    tokens, hidden = make_context(40, 9)
    drafter = EagleDrafter(head, shape, 128)
    ingest(drafter, "a", (tokens[:21], hidden[:20]))
    for lo, hi in [(21, 24), (24, 25), (25, 41)]:
        drafter.propose(["a"])
        drafter.append(ContextChunk("a", lo, tokens[lo:hi], lo - 1, hidden[lo - 1 : hi - 1]))
    assert drafter.num_tokens("a") == 41
    fresh = EagleDrafter(head, shape, 128)
    ingest(fresh, "a", (tokens, hidden))
    assert_same_tree(drafter.propose(["a"])[0], fresh.propose(["a"])[0])


def test_batch_equals_each_alone(head: EagleHead) -> None:
    shape = TreeShape(4, 3, 12)
    contexts = {f"r{i}": make_context(n, 20 + i) for i, n in enumerate([3, 17, 1, 0, 30])}
    together = EagleDrafter(head, shape, 256, max_batch_size=2)
    together.append_many([ContextChunk(r, 0, t, 0, h) for r, (t, h) in contexts.items()])
    trees = together.propose(list(contexts))
    for rid, tree in zip(contexts, trees, strict=True):
        alone = EagleDrafter(head, shape, 256)
        ingest(alone, rid, contexts[rid])
        assert_same_tree(tree, alone.propose([rid])[0])
    assert trees[3] == DraftTree.root_only(contexts["r3"][0][-1])  # one token: nothing to run


def test_context_mismatch_leaves_state_alone(head: EagleHead) -> None:
    tokens, hidden = make_context(10, 4)
    drafter = EagleDrafter(head, TreeShape(3, 2, 8), 64)
    ingest(drafter, "a", (tokens[:6], hidden[:5]))
    before = drafter.propose(["a"])
    bad = [
        ContextChunk("a", 7, tokens[7:], 6, hidden[6:]),  # token gap
        ContextChunk("a", 6, tokens[6:], 6, hidden[6:]),  # row gap
        ContextChunk("a", 6, tokens[6:], 4, hidden[4:]),  # rows overlap
        ContextChunk("a", 6, [], 5, hidden[5:7]),  # a row without its token
        ContextChunk("b", 3, tokens[3:], 2, hidden[2:]),  # unknown request
    ]
    for chunk in bad:
        with pytest.raises(ContextMismatch):
            drafter.append(chunk)
    assert drafter.num_tokens("a") == 6 and drafter.num_hidden_rows("a") == 5
    assert drafter.propose(["a"]) == before
    with pytest.raises(ContextMismatch):
        drafter.propose(["b"])
    drafter.append(ContextChunk("a", 6, tokens[6:8]))  # tokens without their rows: not ready
    with pytest.raises(ContextMismatch):
        drafter.propose(["a"])


def test_bad_input_is_a_value_error(head: EagleHead) -> None:
    drafter = EagleDrafter(head, TreeShape(3, 2, 8), 64)
    with pytest.raises(ValueError):
        drafter.append(ContextChunk("a", 0, [VOCAB], 0, None))
    with pytest.raises(ValueError):
        drafter.append(ContextChunk("a", 0, [1, 2], 0, torch.zeros(1, HIDDEN + 1)))
    assert drafter.num_tokens("a") == 0


def test_release_and_restart_free_draft_slots(head: EagleHead) -> None:
    drafter = EagleDrafter(head, TreeShape(3, 2, 8), 32)
    ingest(drafter, "a", make_context(10, 1))
    ingest(drafter, "b", make_context(5, 2))
    assert drafter.pool.num_free == 32 - 15
    drafter.propose(["a", "b"])
    assert drafter.pool.num_free == 32 - 15  # tree nodes use scratch only
    ingest(drafter, "a", make_context(3, 3))  # start_pos 0 replaces the held context
    assert drafter.pool.num_free == 32 - 8
    assert drafter.release("a") and not drafter.release("a")
    assert drafter.pool.num_free == 32 - 5 and drafter.num_tokens("a") == 0


def test_full_pool_refuses_without_changes(head: EagleHead) -> None:
    drafter = EagleDrafter(head, TreeShape(3, 2, 8), 12)
    ingest(drafter, "a", make_context(8, 1))
    with pytest.raises(DraftPoolFull):
        ingest(drafter, "b", make_context(5, 2))
    assert drafter.num_tokens("b") == 0 and drafter.pool.num_free == 4
    ingest(drafter, "a", make_context(12, 3))  # a restart may reuse its own slots
    assert drafter.pool.num_free == 0


@pytest.mark.slow
def test_smollm2_random_head_proposes_valid_trees() -> None:
    from draft_service.eagle.head import random_head
    from model_runtime.loading import default_model_path, resolve_checkpoint
    from plumbing.paths import default_cache_dir

    checkpoint = resolve_checkpoint(default_model_path(), default_cache_dir())
    head = random_head(checkpoint, seed=0)
    assert head.config.target.hidden_size == 576 and head.config.target.vocab_size == 49152
    shape = TreeShape()
    drafter = EagleDrafter(head, shape, num_slots=512)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 49152, (101,), generator=gen).tolist()
    hidden = torch.randn(100, 576, generator=gen)
    drafter.append(ContextChunk("a", 0, tokens, 0, hidden))
    tree = drafter.propose(["a"])[0]
    check_shape(tree, shape, tokens[-1])
    assert tree.num_nodes == shape.num_draft_tokens


def test_draft_info_names_the_heads_hidden_and_vocabulary_sizes(head: EagleHead) -> None:
    """DraftInfo.hidden_size is the width of the hidden rows the replica reads (it read 0), and
    vocab_size its trees' vocabulary: the router checks both against the target's."""
    from pathlib import Path

    from draft_service.arguments import DraftConfig
    from draft_service.server import draft_info

    drafter = EagleDrafter(head, TreeShape(num_steps=2, topk=2, num_draft_tokens=4), 64)
    info = draft_info(drafter, DraftConfig(method="eagle", cache_dir=Path(".")))
    assert (info.method, info.needs_hidden) == ("eagle", True)
    assert info.hidden_size == head.config.target.hidden_size > 0
    assert info.vocab_size == head.config.target.vocab_size > 0


def test_the_start_up_warm_up_leaves_the_drafter_empty(head: EagleHead) -> None:
    drafter = EagleDrafter(head, SHAPES[0], num_slots=64, max_requests=4)
    warm_up_eager_appends(drafter)
    assert drafter.pool.num_free == 64 and drafter.rows.num_free == 4
    assert drafter.num_tokens("splitspec-warm-up") == 0


@pytest.mark.parametrize("cuts", [[], [5, 11, 12, 20], [17]])
def test_padded_eager_appends_equal_unpadded_ones(head: EagleHead, cuts: list[int]) -> None:
    """CUDA pads an eager append's pairs to a bucket (eager_bucket); here on the CPU the same
    padded step: padding pairs touch only the padding row and the dummy slot."""
    shape = TreeShape(4, 3, 12)
    ctx = make_context(40, 8)
    plain, padded = EagleDrafter(head, shape, 64), EagleDrafter(head, shape, 64)
    padded.pad_eager_appends = True
    for drafter in (plain, padded):
        ingest(drafter, "a", ctx, cuts)
        ingest(drafter, "b", make_context(9, 9))
    for rid in ("a", "b"):
        assert_same_tree(padded.propose([rid])[0], plain.propose([rid])[0])
    assert padded.pool.num_free == plain.pool.num_free
