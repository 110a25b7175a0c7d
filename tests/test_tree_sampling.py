"""Tree rejection sampling: exact output distribution, a sample-by-sample reference, Monte Carlo."""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from target_service.tree import Acceptance
from target_service.tree_sampling import tree_rejection_sample
from tests.test_tree import PyTree, eagle_parents, pad_tree, shuffle_topologically, to_tensors

Context = tuple[int, ...]
Target = Callable[[Context], list[float]]


def make_target(seed: int, vocab: int, kind: str) -> Target:
    """A deterministic "model": context -> next-token distribution, memoised.

    ``dense``: temperature-like softmax of Gaussian logits. ``topk``: the same truncated to its
    1..V-1 most likely tokens and renormalised, so zeros appear as after top-k/top-p.
    """
    cache: dict[Context, list[float]] = {}

    def target(context: Context) -> list[float]:
        if context not in cache:
            rng = random.Random(f"{seed}/{context}")
            temperature = rng.choice([0.3, 1.0, 2.0])
            weights = [math.exp(rng.gauss(0.0, 1.0) / temperature) for _ in range(vocab)]
            if kind == "topk":
                keep = sorted(range(vocab), key=weights.__getitem__)[-rng.randint(1, vocab - 1) :]
                weights = [w if t in keep else 0.0 for t, w in enumerate(weights)]
            total = sum(weights)
            cache[context] = [w / total for w in weights]
        return cache[context]

    return target


def sampled_tree(
    rng: random.Random, target: Target, vocab: int, max_nodes: int, shape: tuple[int, int] = (0, 0)
) -> PyTree:
    """Small EAGLE-style tree whose tokens mix likely, unlikely, zero-mass and repeated tokens.

    ``shape`` is (topk, steps); zeros pick each at random in 1..3.
    """
    topk, steps = (s or rng.randint(1, 3) for s in shape)
    parents = shuffle_topologically(rng, eagle_parents(rng, topk, steps, max_nodes))
    tokens = [rng.randrange(vocab)]
    for node in range(1, len(parents)):
        q = target(context_of(tokens, parents, parents[node]))
        zeros = [t for t in range(vocab) if q[t] == 0.0]
        used = [tokens[s] for s in range(1, node) if parents[s] == parents[node]]
        roll = rng.random()
        if zeros and roll < 0.2:
            tokens.append(rng.choice(zeros))
        elif used and roll < 0.3:
            tokens.append(rng.choice(used))
        else:
            tokens.append(rng.choices(range(vocab), weights=[w + 0.05 for w in q])[0])
    return PyTree(tokens, parents, [True] * len(parents))


def context_of(tokens: list[int], parents: list[int], node: int) -> Context:
    chain = []
    while node >= 0:
        chain.append(tokens[node])
        node = parents[node]
    return tuple(reversed(chain))


def target_rows(tree: PyTree, target: Target, vocab: int) -> list[list[float]]:
    """q after every node; padding rows get an arbitrary distribution."""
    return [
        target(context_of(tree.tokens, tree.parents, n)) if v else [1.0 / vocab] * vocab
        for n, v in enumerate(tree.valid)
    ]


def algorithm_distribution(
    tree: PyTree, rows: list[list[float]], node: int = 0
) -> dict[Context, float]:
    """Exact law of the emitted tokens (accepted drafts, then the final token) from ``node``."""
    out: dict[Context, float] = defaultdict(float)
    residual, reach = list(rows[node]), 1.0
    for child in tree.children(node):
        total, token = sum(residual), tree.tokens[child]
        accept = residual[token] / total if total > 0 else 0.0
        if accept > 0 and reach > 0:
            for tail, p in algorithm_distribution(tree, rows, child).items():
                out[(token, *tail)] += reach * accept * p
        reach *= 1.0 - accept
        residual[token] = 0.0
    total = sum(residual)
    for token, mass in enumerate(residual):
        if mass > 0 and reach > 0:
            out[(token,)] += reach * mass / total
    return out


def chain_probability(target: Target, context: Context, tokens: Context) -> float:
    p = 1.0
    for token in tokens:
        p *= target(context)[token]
        context = (*context, token)
    return p


def reference_sample(
    tree: PyTree, rows: list[list[float]], uniforms: list[float]
) -> tuple[list[int], int]:
    """The algorithm as specified, one coin per decision; returns (path, next_token)."""
    path = [0]
    while True:
        residual, accepted = list(rows[path[-1]]), None
        for child in tree.children(path[-1]):
            token = tree.tokens[child]
            if residual[token] > 0 and uniforms[child] < residual[token] / sum(residual):
                accepted = child
                break
            residual[token] = 0.0
        if accepted is None:
            break
        path.append(accepted)
    threshold, cumulative = uniforms[-1] * sum(residual), 0.0
    for token, mass in enumerate(residual):
        cumulative += mass
        if cumulative > threshold:
            return path, token
    raise AssertionError("inverse CDF ran off the end")


CASES = [
    (seed, vocab, kind) for seed in range(12) for vocab in (3, 4, 5) for kind in ("dense", "topk")
]


@pytest.mark.parametrize(("seed", "vocab", "kind"), CASES)
def test_emitted_tokens_follow_the_target_exactly(seed: int, vocab: int, kind: str) -> None:
    rng = random.Random(seed)
    target = make_target(seed, vocab, kind)
    tree = sampled_tree(rng, target, vocab, max_nodes=10)
    law = algorithm_distribution(tree, target_rows(tree, target, vocab))
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    root = (tree.tokens[0],)
    longest = max(len(seq) for seq in law)
    for length in sorted({1, 2, longest}):
        for seq in itertools.product(range(vocab), repeat=length):
            # Shorter outputs continue as the next decode step would: by sampling the target.
            p = sum(
                mass * chain_probability(target, root + out, seq[len(out) :])
                for out, mass in law.items()
                if seq[: len(out)] == out[:length]
            )
            assert p == pytest.approx(chain_probability(target, root, seq), abs=1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_tensor_sampler_matches_reference_sample_by_sample(seed: int) -> None:
    rng = random.Random(100 + seed)
    vocab = rng.randint(3, 8)
    target = make_target(seed, vocab, rng.choice(["dense", "topk"]))
    trees = [sampled_tree(rng, target, vocab, 40) for _ in range(rng.randint(1, 5))]
    num_nodes = max(len(t.parents) for t in trees) + rng.randint(0, 3)
    trees = [pad_tree(rng, t, num_nodes) for t in trees]
    rows = [target_rows(t, target, vocab) for t in trees]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(20):
        uniforms = torch.rand(len(trees), num_nodes + 1, generator=gen, dtype=torch.float64)
        result = tree_rejection_sample(*to_tensors(trees), torch.tensor(rows), uniforms)
        for b, tree in enumerate(trees):
            path, token = reference_sample(tree, rows[b], uniforms[b].tolist())
            assert result.path[b].tolist() == path + [-1] * (num_nodes - len(path))
            assert result.num_accepted[b].item() == len(path) - 1
            assert result.next_token[b].item() == token


def chi_square_p_value(counts: dict[Context, int], law: dict[Context, float], n: int) -> float:
    """Pearson's test; outcomes expected < 5 times are pooled into one bin."""
    assert set(counts) <= set(law), "sampled an outcome of probability zero"
    big = [seq for seq, p in law.items() if p * n >= 5]
    pooled_p = 1.0 - sum(law[s] for s in big)
    pooled_count = n - sum(counts.get(s, 0) for s in big)
    bins = [(counts.get(s, 0), law[s] * n) for s in big]
    if pooled_p * n >= 1:
        bins.append((pooled_count, pooled_p * n))
    stat = sum((obs - exp) ** 2 / exp for obs, exp in bins)
    dof = torch.tensor(len(bins) - 1, dtype=torch.float64)
    return torch.special.gammaincc(dof / 2, torch.tensor(stat / 2, dtype=torch.float64)).item()


def monte_carlo_counts(
    tree: PyTree, rows: list[list[float]], n: int, seed: int
) -> tuple[dict[Context, int], Acceptance]:
    tokens, parents, valid = (t.expand(n, -1) for t in to_tensors([tree]))
    probs = torch.tensor(rows, dtype=torch.float32).expand(n, -1, -1)
    gen = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(n, len(tree.parents) + 1, generator=gen)
    result = tree_rejection_sample(tokens, parents, valid, probs, uniforms)
    draft = torch.where(result.path > 0, tokens.gather(1, result.path.clamp(min=0)), -1)[:, 1:]
    emitted = torch.cat([draft, torch.full((n, 1), -1)], dim=1)
    emitted.scatter_(1, result.num_accepted.unsqueeze(1), result.next_token.unsqueeze(1))
    outcomes, freq = torch.unique(emitted, dim=0, return_counts=True)
    return {
        tuple(t for t in row if t >= 0): c
        for row, c in zip(outcomes.tolist(), freq.tolist(), strict=True)
    }, result


@pytest.mark.parametrize(("seed", "kind"), [(0, "dense"), (1, "topk"), (2, "topk"), (3, "dense")])
def test_monte_carlo_matches_exact_law(seed: int, kind: str) -> None:
    rng = random.Random(500 + seed)
    vocab = 5
    target = make_target(seed, vocab, kind)
    tree = sampled_tree(rng, target, vocab, max_nodes=10, shape=(3, 3))
    rows = target_rows(tree, target, vocab)
    counts, _ = monte_carlo_counts(tree, rows, 200_000, seed)
    assert chi_square_p_value(counts, algorithm_distribution(tree, rows), 200_000) > 1e-3


def test_zero_probability_draft_token_is_never_accepted() -> None:
    vocab = 4
    # Root children: token 1 has q = 0 at the root; it comes first and repeats later as well.
    tree = PyTree(tokens=[0, 1, 2, 1, 3, 0], parents=[-1, 0, 0, 0, 1, 2], valid=[True] * 6)
    rows = [[0.5, 0.0, 0.3, 0.2]] + [[0.1, 0.2, 0.3, 0.4]] * 5
    law = algorithm_distribution(tree, rows)
    assert all(seq[0] != 1 for seq in law)
    counts, result = monte_carlo_counts(tree, rows, 200_000, 9)
    assert not (result.path == 1).any() and not (result.path == 3).any()
    assert chi_square_p_value(counts, law, 200_000) > 1e-3
    first = {t: sum(c for s, c in counts.items() if s[0] == t) / 200_000 for t in range(vocab)}
    assert first == pytest.approx({0: 0.5, 1: 0.0, 2: 0.3, 3: 0.2}, abs=0.005)


def test_low_precision_probs_and_unnormalised_rows() -> None:
    tree = pad_tree(random.Random(3), PyTree([2, 0, 1, 3], [-1, 0, 0, 1], [True] * 4), 6)
    probs = torch.rand(1, 6, 7, generator=torch.Generator().manual_seed(0)) * 3
    probs[..., 5] = 0.0
    tokens, parents, valid = (t.expand(1000, -1) for t in to_tensors([tree]))
    uniforms = torch.rand(1000, 7, generator=torch.Generator().manual_seed(1))
    result = tree_rejection_sample(
        tokens, parents, valid, probs.expand(1000, -1, -1).bfloat16(), uniforms
    )
    assert result.next_token.dtype == torch.long
    assert ((result.next_token >= 0) & (result.next_token < 7) & (result.next_token != 5)).all()
    assert (result.num_accepted <= 2).all() and (result.num_accepted >= 0).all()


@pytest.mark.parametrize(
    ("coin", "coin_dtype"),
    [(0.0, torch.float32), (1.0 - 2.0**-24, torch.float32), (1.0 - 2.0**-53, torch.float64)],
)
def test_extreme_coins_never_pick_zero_mass_tokens(coin: float, coin_dtype: torch.dtype) -> None:
    # Zero mass at both ends of the vocabulary, where inverse-CDF ties and round-ups land; node 4
    # holds all the mass left once nodes 1 and 2 are rejected, so even the largest coin takes it.
    tree = PyTree(tokens=[1, 0, 3, 2, 1], parents=[-1, 0, 0, 2, 0], valid=[True] * 5)
    rows = [
        [0.0, 0.6, 0.0, 0.4, 0.0],
        [0.2, 0.2, 0.2, 0.2, 0.2],
        [0.0, 0.0, 0.3, 0.7, 0.0],
        [0.0, 0.5, 0.5, 0.0, 0.0],
        [0.0, 0.2, 0.3, 0.5, 0.0],
    ]
    uniforms = torch.full((1, 6), coin, dtype=coin_dtype)
    result = tree_rejection_sample(*to_tensors([tree]), torch.tensor([rows]), uniforms)
    path, token = reference_sample(tree, rows, uniforms[0].tolist())
    assert path == ([0, 2, 3] if coin == 0.0 else [0, 4])
    assert result.path[0].tolist() == path + [-1] * (5 - len(path))
    assert result.next_token.tolist() == [token]
    assert rows[path[-1]][token] > 0


def test_coin_of_one_still_draws_a_token_with_mass() -> None:
    # Out of contract, but low-precision generators do round up to 1.0; the draw must stay valid.
    probs = torch.tensor([[[0.0, 0.6, 0.0, 0.4, 0.0]]]).bfloat16()
    root = torch.zeros(1, 1, dtype=torch.long)
    result = tree_rejection_sample(
        root, root - 1, torch.ones(1, 1, dtype=torch.bool), probs, torch.ones(1, 2).bfloat16()
    )
    assert result.next_token.tolist() == [3]
    assert result.path.tolist() == [[0]] and result.num_accepted.tolist() == [0]
