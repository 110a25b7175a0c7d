"""Tree layout, greedy acceptance and KV compaction against brute-force Python references."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from target_service.tree import compact_accepted, greedy_accept, tree_attention_mask


@dataclass
class PyTree:
    """One padded tree as plain lists; padding nodes have parent 0 and valid False."""

    tokens: list[int]
    parents: list[int]
    valid: list[bool]

    def children(self, node: int) -> list[int]:
        return [c for c in range(1, len(self.parents)) if self.valid[c] and self.parents[c] == node]


def eagle_parents(rng: random.Random, topk: int, steps: int, max_nodes: int = 64) -> list[int]:
    """EAGLE-style shape: each step expands up to ``topk`` nodes of the last depth by 1..topk."""
    parents, frontier = [-1], [0]
    for _ in range(steps):
        grown = []
        for parent in rng.sample(frontier, min(topk, len(frontier))):
            for _ in range(rng.randint(1, topk)):
                if len(parents) < max_nodes:
                    parents.append(parent)
                    grown.append(len(parents) - 1)
        if not grown:
            break
        frontier = grown
    return parents


def shuffle_topologically(rng: random.Random, parents: list[int]) -> list[int]:
    """Relabel nodes in a random order that still lists parents before children."""
    placed, order = {0: 0}, [0]
    ready = [c for c in range(1, len(parents)) if parents[c] == 0]
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        placed[node] = len(order)
        order.append(node)
        ready += [c for c in range(1, len(parents)) if parents[c] == node]
    return [-1] + [placed[parents[old]] for old in order[1:]]


def pad_tree(rng: random.Random, tree: PyTree, num_nodes: int) -> PyTree:
    """Insert padding nodes at random positions after the root, up to ``num_nodes``."""
    slots = [True] * (len(tree.parents) - 1) + [False] * (num_nodes - len(tree.parents))
    rng.shuffle(slots)
    new_index, out = {0: 0}, PyTree([tree.tokens[0]], [-1], [True])
    real = iter(range(1, len(tree.parents)))
    for is_real in slots:
        if is_real:
            old = next(real)
            new_index[old] = len(out.parents)
            out.tokens.append(tree.tokens[old])
            out.parents.append(new_index[tree.parents[old]])
        else:
            out.tokens.append(rng.randrange(-1, 3))
            out.parents.append(0)
        out.valid.append(is_real)
    return out


def random_tree(rng: random.Random, vocab: int, dup_rate: float = 0.0) -> PyTree:
    """Shuffled EAGLE-style tree; siblings get distinct tokens except at ``dup_rate``."""
    parents = shuffle_topologically(rng, eagle_parents(rng, rng.randint(1, 8), rng.randint(1, 6)))
    tokens = [rng.randrange(vocab)]
    for node in range(1, len(parents)):
        used = [tokens[s] for s in range(1, node) if parents[s] == parents[node]]
        if used and rng.random() < dup_rate:
            tokens.append(rng.choice(used))
        else:
            tokens.append(rng.choice([t for t in range(vocab) if t not in used]))
    return PyTree(tokens, parents, [True] * len(parents))


def random_batch(rng: random.Random, batch: int, vocab: int, dup_rate: float = 0.0) -> list[PyTree]:
    trees = [random_tree(rng, vocab, dup_rate) for _ in range(batch)]
    num_nodes = max(len(t.parents) for t in trees) + rng.randint(0, 3)
    return [pad_tree(rng, t, num_nodes) for t in trees]


def to_tensors(trees: list[PyTree]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.tensor([t.tokens for t in trees]),
        torch.tensor([t.parents for t in trees]),
        torch.tensor([t.valid for t in trees]),
    )


def reference_ancestors(tree: PyTree) -> list[list[bool]]:
    rows = []
    for node in range(len(tree.parents)):
        row = [False] * len(tree.parents)
        row[node] = True
        while tree.valid[node] and node > 0:
            node = tree.parents[node]
            row[node] = True
        rows.append(row)
    return rows


def reference_greedy(tree: PyTree, target_next: list[int]) -> list[int]:
    path = [0]
    while True:
        match = [c for c in tree.children(path[-1]) if tree.tokens[c] == target_next[path[-1]]]
        if not match:
            return path
        path.append(match[0])


def plant_matches(rng: random.Random, tree: PyTree, vocab: int) -> list[int]:
    """Random argmaxes, then a random-length chain of them rewritten to match the tree."""
    target_next = [rng.randrange(vocab) for _ in tree.parents]
    node = 0
    for _ in range(rng.randint(0, 6)):
        children = tree.children(node)
        if not children:
            break
        child = rng.choice(children)
        target_next[node] = tree.tokens[child]
        node = child
    return target_next


@pytest.mark.parametrize("seed", range(20))
def test_layout_matches_reference(seed: int) -> None:
    rng = random.Random(seed)
    trees = random_batch(rng, rng.randint(1, 6), vocab=50)
    _, parents, valid = to_tensors(trees)
    layout = tree_attention_mask(parents, valid)
    expected = torch.tensor([reference_ancestors(t) for t in trees])
    assert torch.equal(layout.ancestors, expected)
    assert layout.depths.dtype == torch.long
    assert torch.equal(layout.depths, expected.sum(-1) - 1)


def test_layout_of_a_chain_is_lower_triangular() -> None:
    for num_nodes in range(1, 70):
        parents = torch.arange(-1, num_nodes - 1).unsqueeze(0)
        layout = tree_attention_mask(parents, torch.ones_like(parents, dtype=torch.bool))
        assert torch.equal(layout.ancestors[0], torch.ones(num_nodes, num_nodes).tril().bool())
        assert torch.equal(layout.depths[0], torch.arange(num_nodes))


@pytest.mark.parametrize("seed", range(40))
def test_greedy_matches_reference(seed: int) -> None:
    rng = random.Random(1000 + seed)
    vocab = 12
    trees = random_batch(rng, rng.randint(1, 6), vocab, dup_rate=0.2)
    target_next = [plant_matches(rng, t, vocab) for t in trees]
    tokens, parents, valid = to_tensors(trees)
    result = greedy_accept(tokens, parents, valid, torch.tensor(target_next))
    for b, tree in enumerate(trees):
        path = reference_greedy(tree, target_next[b])
        padded = path + [-1] * (len(tree.parents) - len(path))
        assert result.path[b].tolist() == padded
        assert result.num_accepted[b].item() == len(path) - 1
        assert result.next_token[b].item() == target_next[b][path[-1]]


def test_greedy_path_lengths_cover_a_range() -> None:
    rng = random.Random(7)
    lengths = set()
    for _ in range(30):
        trees = random_batch(rng, 4, 12)
        target_next = torch.tensor([plant_matches(rng, t, 12) for t in trees])
        lengths |= set(greedy_accept(*to_tensors(trees), target_next).num_accepted.tolist())
    assert {0, 1, 2, 3, 4} <= lengths


@pytest.mark.parametrize("seed", range(10))
def test_greedy_accepts_full_depth_when_tree_holds_the_continuation(seed: int) -> None:
    rng = random.Random(2000 + seed)
    tree = pad_tree(rng, random_tree(rng, 30), 70)
    depths = [sum(r) - 1 for r in reference_ancestors(tree)]
    leaf = max(range(len(depths)), key=lambda n: (depths[n], -n))
    chain = [n for n in range(len(depths)) if reference_ancestors(tree)[leaf][n]]
    continuation = [tree.tokens[n] for n in chain[1:]] + [rng.randrange(30)]
    # The target greedily continues along `chain`; elsewhere it emits tokens the tree lacks.
    target_next = [continuation[depths[n]] if n in chain else 30 + n for n in range(70)]
    tokens, parents, valid = to_tensors([tree])
    result = greedy_accept(tokens, parents, valid, torch.tensor([target_next]))
    assert result.num_accepted.tolist() == [depths[leaf]]
    assert result.path[0, : len(chain)].tolist() == chain
    assert result.next_token.tolist() == [continuation[-1]]


def reference_compact(
    pool: torch.Tensor, node_slots: list[list[int]], paths: list[list[int]]
) -> torch.Tensor:
    moved = pool.clone()
    for slots, path in zip(node_slots, paths, strict=True):
        for j, node in enumerate(path):
            if node >= 0:
                moved[slots[j]] = pool[slots[node]]
    return moved


@pytest.mark.parametrize("seed", range(20))
def test_compact_matches_reference(seed: int) -> None:
    rng = random.Random(3000 + seed)
    trees = random_batch(rng, rng.randint(1, 5), 12)
    target_next = torch.tensor([plant_matches(rng, t, 12) for t in trees])
    path = greedy_accept(*to_tensors(trees), target_next).path
    num_nodes = path.shape[1]
    num_slots = len(trees) * num_nodes + rng.randint(0, 10)
    dummy = num_slots
    free = rng.sample(range(num_slots), num_slots)
    node_slots = [[free.pop() if v else dummy for v in t.valid] for t in trees]
    gen = torch.Generator().manual_seed(seed)
    pools = [
        torch.randn(num_slots + 1, 2, 3, 4, generator=gen),
        torch.randn(num_slots + 1, 5, generator=gen),
    ]
    pools.append(torch.randn(num_slots + 1, 8, generator=gen).to(torch.bfloat16))
    expected = [reference_compact(p, node_slots, path.tolist()) for p in pools]
    compact_accepted(pools, torch.tensor(node_slots), path, dummy)
    for got, want in zip(pools, expected, strict=True):
        assert torch.equal(got[:dummy], want[:dummy])


def test_compact_handles_overlapping_moves() -> None:
    # Path 0 -> 2 -> 3 -> 4 with slots laid out so destinations are later sources.
    pool = torch.arange(6.0).unsqueeze(1)
    compact_accepted([pool], torch.tensor([[0, 1, 2, 3, 4]]), torch.tensor([[0, 2, 3, 4, -1]]), 5)
    assert pool.squeeze(1).tolist() == [0.0, 2.0, 3.0, 4.0, 4.0, 5.0]
