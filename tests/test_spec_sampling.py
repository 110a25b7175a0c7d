"""Speculative sampling is exact: what a verify emits is what target-only decoding draws.

No gRPC here: a TargetEngine runs a tiny random Llama (vocabulary 8, fp64) in this process.
Thousands of requests with different seeds share one prompt and one fixed draft tree per
verify call; the law of the first token, and of the first two tokens, they emit is compared by
chi-square with the distribution computed from the model's logits after the penalties
(target_service.penalties: repetition_penalty, min_tokens' ban) and temperature/top-k/top-p/min-p
(model_runtime.sampling.filtered_probs) on plain target-only prefills; and token by token,
each seed's tokens equal those of the same request decoded target-only, however much of the
tree it accepted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from model_runtime.loading import load_model
from model_runtime.sampling import SamplingTensors, filtered_probs
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.penalties import penalize
from target_service.request_table import RequestState, SamplingSpec
from tests.helpers.tiny_llama import TinyLlama, tiny_llama_dir

pytestmark = pytest.mark.timeout(300)
VOCAB = 8
PROMPT = [3, 1, 4, 1, 5]
NUM_SAMPLES = 20_000
PER_CALL = 5_000
MIN_P_VALUE = 1e-3
MAX_REQUESTS = PER_CALL + 64
SHAPE = TinyLlama(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position=64,
    seed=5,
    logit_scale=3.0,
    with_tokenizer=False,
)
BANNED = 2  # min_tokens' "EOS" in the min_tokens setting
# (name, temperature, top_k, top_p, min_p, repetition_penalty, min_tokens)
SETTINGS = [
    ("t0.7", 0.7, 0, 1.0, 0.0, 1.0, 0),
    ("t1.0", 1.0, 0, 1.0, 0.0, 1.0, 0),
    ("top_k3", 1.0, 3, 1.0, 0.0, 1.0, 0),
    ("top_p0.8", 0.9, 0, 0.8, 0.0, 1.0, 0),
    ("min_p0.15", 1.0, 0, 1.0, 0.15, 1.0, 0),
    ("rep1.8_min1", 0.9, 0, 1.0, 0.0, 1.8, 1),
]


def spec_of(setting: tuple, seed: int) -> SamplingSpec:
    _, temperature, top_k, top_p, min_p, repetition, min_tokens = setting
    return SamplingSpec(
        temperature, top_p, top_k, seed, min_p=min_p, repetition_penalty=repetition,
        repetition_context=tuple(PROMPT), min_tokens=min_tokens, min_tokens_banned_ids=(BANNED,),
    )  # fmt: skip


class Slots:
    """Hands out KV slots the way the router does: fresh ones per request, freed in bulk."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.next = 0

    def take(self, n: int) -> list[int]:
        assert self.next + n <= self.num_slots, "test slot budget exhausted"
        out = list(range(self.next, self.next + n))
        self.next += n
        return out

    def reset(self) -> None:
        self.next = 0


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TargetEngine:
    model_dir = tiny_llama_dir(tmp_path_factory.getbasetemp(), SHAPE)
    model = load_model(model_dir, torch.float64, torch.device("cpu"), Path(model_dir))
    config = TargetConfig(
        model_path=model_dir,
        cache_dir=model_dir,
        dtype="float64",
        num_slots=MAX_REQUESTS * 16,
        max_requests=MAX_REQUESTS,
        max_batch_tokens=MAX_REQUESTS * 16,
        max_context=48,
        max_lookahead=16,
    )
    return TargetEngine(config, model)


@pytest.fixture(scope="module")
def slots(engine: TargetEngine) -> Slots:
    return Slots(engine.config.num_slots)


def target_probs(
    engine: TargetEngine, slots: Slots, context: list[int], setting: tuple[str, float, int, float]
) -> torch.Tensor:
    """The target's next-token distribution after ``context``, from a plain prefill."""
    _, temperature, top_k, top_p, min_p, *_ = setting
    rid = f"ref-{len(context)}-{'-'.join(map(str, context))}"
    greedy = SamplingSpec(0.0, 1.0, 0, 0)
    engine.forward([StepItem(rid, context, 0, slots.take(len(context)), False, greedy)])
    hidden = engine.read_hidden(rid, len(context) - 1, len(context))
    engine.release([rid])
    with torch.inference_mode():
        logits = engine.model.logits(hidden)
    # What sequential decoding sees after ``context``: its tokens, len(context) - len(PROMPT)
    # sampled since the prompt.
    spec = replace(spec_of(setting, 0), repetition_context=tuple(context))
    logits = penalize(logits, [RequestState(0, 0, spec, num_sampled=len(context) - len(PROMPT))])
    params = SamplingTensors(
        torch.tensor([temperature]),
        torch.tensor([top_p]),
        torch.tensor([top_k]),
        torch.tensor([0]),
        torch.tensor([0]),
        torch.tensor([min_p]),
    )
    return filtered_probs(logits, params)[0].double()


def draft_tree(p1: torch.Tensor, p2: dict[int, torch.Tensor]) -> tuple[list[int], list[int]]:
    """A fixed EAGLE-like tree: the root's three children are its most likely, second most
    likely and least likely tokens (zero mass under top-k/top-p); the first two get children
    of their own (most likely, then least likely), and the chain continues one level deeper."""
    order = p1.argsort(descending=True).tolist()
    a, b, z = order[0], order[1], order[-1]
    after_a = p2[a].argsort(descending=True).tolist()
    after_b = p2[b].argsort(descending=True).tolist()
    tokens = [PROMPT[-1], a, b, z, after_a[0], after_a[-1], after_b[0], 0]
    parents = [-1, 0, 0, 0, 1, 1, 2, 4]
    return tokens, parents


def laws_and_tree(engine: TargetEngine, slots: Slots, setting: tuple) -> tuple:
    """The target's law of the first token, of the second after each first, and the fixed
    draft tree built from them."""
    slots.reset()
    p1 = target_probs(engine, slots, PROMPT, setting)
    p2 = {x: target_probs(engine, slots, [*PROMPT, x], setting) for x in range(VOCAB)}
    return p1, p2, draft_tree(p1, p2)


def emit(
    engine: TargetEngine,
    slots: Slots,
    setting: tuple[str, float, int, float],
    seeds: list[int],
    tree: tuple[list[int], list[int]],
) -> list[tuple[int, int]]:
    """The first two tokens each seeded request generates: the verify's emitted block, plus
    one ordinary decode step where the verify emitted a single token."""
    tokens, parents = tree
    prompt_len = len(PROMPT)
    rids = [f"s{setting[0]}-{seed}" for seed in seeds]
    engine.forward(
        [
            StepItem(
                rid,
                PROMPT[:-1],
                0,
                slots.take(prompt_len - 1),
                False,
                spec_of(setting, seed),
            )
            for rid, seed in zip(rids, seeds, strict=True)
        ]
    )
    results, *_ = engine.verify(
        [VerifyItem(rid, prompt_len - 1, tokens, parents, slots.take(len(tokens))) for rid in rids]
    )
    firsts = [r.token_ids for r in results]
    short = [i for i, ids in enumerate(firsts) if len(ids) == 1]
    if short:
        step = engine.forward([StepItem(rids[i], firsts[i], prompt_len, [], True) for i in short])
        for i, token in zip(short, step.next_token_ids, strict=True):
            firsts[i] = [*firsts[i], token]
    engine.release(rids)
    return [(ids[0], ids[1]) for ids in firsts]


def chi_square_p_value(counts: Counter, expected: dict, n: int) -> float:
    """Pearson's test; bins expecting fewer than 5 are pooled, unexpected outcomes fail."""
    unexpected = set(counts) - {k for k, p in expected.items() if p > 0}
    assert not unexpected, f"outcomes with zero target probability: {sorted(unexpected)[:5]}"
    bins, pooled_obs, pooled_exp = [], 0, 0.0
    for key, p in expected.items():
        if p * n >= 5:
            bins.append((counts.get(key, 0), p * n))
        else:
            pooled_obs, pooled_exp = pooled_obs + counts.get(key, 0), pooled_exp + p * n
    if pooled_exp > 0:
        bins.append((pooled_obs, pooled_exp))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    dof = torch.tensor(len(bins) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_emitted_tokens_follow_the_target_distribution(
    engine: TargetEngine, slots: Slots, setting: tuple
) -> None:
    p1, p2, tree = laws_and_tree(engine, slots, setting)
    joint = {(x, y): float(p1[x] * p2[x][y]) for x in range(VOCAB) for y in range(VOCAB)}
    first = {x: float(p1[x]) for x in range(VOCAB)}
    if setting[2] or setting[3] < 1.0 or setting[4]:
        assert p1[tree[0][3]] == 0, "the tree should hold a zero-probability draft"
    assert p1.max() < 0.9, "a near-deterministic target makes the test weak"

    samples: list[tuple[int, int]] = []
    for start in range(0, NUM_SAMPLES, PER_CALL):
        slots.reset()
        seeds = list(range(start, start + PER_CALL))
        samples += emit(engine, slots, setting, seeds, tree)

    p_first = chi_square_p_value(Counter(x for x, _ in samples), first, len(samples))
    p_joint = chi_square_p_value(Counter(samples), joint, len(samples))
    assert p_first > MIN_P_VALUE, f"first token: p = {p_first:.2e}"
    assert p_joint > MIN_P_VALUE, f"first two tokens: p = {p_joint:.2e}"
    # The tree must matter: many requests emit accepted drafts, some emit corrections.
    accepted = sum(x in tree[0][1:3] for x, _ in samples) / len(samples)
    assert 0.2 < accepted < 1.0


def test_a_seed_reproduces_a_request_whatever_its_batch(engine: TargetEngine, slots: Slots) -> None:
    setting = SETTINGS[1]
    _, _, tree = laws_and_tree(engine, slots, setting)
    seeds = list(range(1000, 1400))
    together = emit(engine, slots, setting, seeds, tree)
    slots.reset()
    alone = [emit(engine, slots, setting, [s], tree)[0] for s in reversed(seeds[:20])][::-1]
    shuffled = emit(engine, slots, setting, seeds[::-1], tree)[::-1]
    assert together[:20] == alone
    assert together == shuffled
    other_seeds = emit(engine, slots, setting, [s + 7919 for s in seeds], tree)
    assert other_seeds != together


def target_only(
    engine: TargetEngine, slots: Slots, setting: tuple, seeds: list[int]
) -> list[tuple[int, int]]:
    """The first two tokens each seeded request draws without speculation: a prefill that
    samples, then one decode step."""
    rids = [f"plain{setting[0]}-{seed}" for seed in seeds]
    spec = [spec_of(setting, seed) for seed in seeds]
    first = engine.forward(
        [
            StepItem(rid, PROMPT, 0, slots.take(len(PROMPT)), True, s)
            for rid, s in zip(rids, spec, strict=True)
        ]
    ).next_token_ids
    second = engine.forward(
        [
            StepItem(rid, [t], len(PROMPT), slots.take(1), True)
            for rid, t in zip(rids, first, strict=True)
        ]
    ).next_token_ids
    engine.release(rids)
    return list(zip(first, second, strict=True))


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_a_verify_emits_the_tokens_target_only_draws(
    engine: TargetEngine, slots: Slots, setting: tuple
) -> None:
    _, _, tree = laws_and_tree(engine, slots, setting)
    seeds = list(range(2000, 2600))
    speculative = emit(engine, slots, setting, seeds, tree)
    slots.reset()
    plain = target_only(engine, slots, setting, seeds)
    differ = [s for s, a, b in zip(seeds, speculative, plain, strict=True) if a != b]
    assert not differ, f"seeds whose tokens differ: {differ[:10]}"
    # Both kinds of block happen: drafts accepted (from the tree) and the first draw refused.
    from_tree = sum(x in tree[0][1:4] for x, _ in plain) / len(plain)
    assert 0.2 < from_tree < 1.0
