"""Greedy speculative decoding is lossless end to end (real processes, real gRPC).

One stack per drafter on a tiny random fp64 Llama: n-gram, EAGLE with a random head, and EAGLE
with an "oracle" head that drafts the target's own continuation most of the time (so EAGLE trees
get accepted deep, through first and later children). Every speculative output is compared with
the same request sent target-only (speculation.enabled = false) to the same stack, token for
token, on 50 random prompts of 1..300 ids sent concurrently with mixed lengths and limits; then
max_new_tokens limits and stop strings chosen to fall inside blocks that speculation accepted.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from protos import generation_pb2 as pb
from router.tokenizer import Tokenizer
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    Stream,
    ids_request,
    oracle_head_dir_fixture,
    random_prompts,
    running_stack,
    stop_string_at,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(300)  # a hung service fails this module's test, not the run
NUM_PROMPTS = 50
MAX_NEW_CHOICES = (1, 2, 5, 12, 24, 32, 48, 64)
NUM_CUT_CASES = 6
NUM_SAMPLED = 8  # sampled requests mixed into the first batch: verify batches mix both kinds
# Their tokens after the first are verify rounds that mix both kinds; each such round sorts the
# whole vocabulary for every node of the batch (the random head's round ~1.4 s), so a few will do.
SAMPLED_NEW = 4
SEEDED_NEW = 12  # tokens of each seeded request: draws keyed by (seed, position), all compared
# The block-cutting tests replay a run's verified blocks. A replica skipped for a missed adaptive
# deadline (a busy CI machine), or a request whose drafter catches up a step later than in the
# first run, would move where the blocks fall: long deadlines, and every catch-up at once.
ROUTER_ARGS = [
    "--max-running", "256", "--draft-deadline-floor", "5", "--max-catch-up-per-step", "256",
]  # fmt: skip
TARGET_ARGS = ["--num-slots", "65536"]
# Per drafter: the replica's arguments and the router's --max-speculative-batch. The oracle
# stack starts above its limit (all target-only), then speculates once requests finish: its
# requests switch modes mid-generation and catch their drafter up from the hidden pool.
DRAFTERS = {
    "ngram": ["--method", "ngram"],
    # A small tree: with nothing accepted every token costs a round, and on a CPU the LM head
    # over 49152 ids dominates both the draft and the verify.
    "eagle-random": [
        "--method",
        "eagle",
        "--num-steps",
        "3",
        "--topk",
        "2",
        "--num-draft-tokens",
        "8",
    ],
    "eagle-oracle": ["--method", "eagle", "--eagle-head", "{oracle}"],
}
MAX_SPECULATIVE_BATCH = {"ngram": 1000, "eagle-random": 1000, "eagle-oracle": 40}
ACCEPTS = {"ngram", "eagle-oracle"}  # drafters that must get drafts accepted here
# Tests take `env` by indirect parametrization; pytest groups them by drafter, so each stack
# starts once. The random head accepts almost nothing: tests that need accepted blocks, or
# that only add sampled rounds, run on the other two.
EVERY_DRAFTER = pytest.mark.parametrize("env", list(DRAFTERS), indirect=True)
ACCEPTING_DRAFTERS = pytest.mark.parametrize(
    "env", [name for name in DRAFTERS if name in ACCEPTS], indirect=True
)


@dataclass
class Env:
    name: str
    router: Router
    tokenizer: Tokenizer


@dataclass
class Batch:
    """The first concurrent batch: prompts, limits and both modes' streams."""

    prompts: list[list[int]]
    max_new: list[int]
    spec: list[Stream]
    base: list[Stream]


@pytest.fixture(scope="module")
def env(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    oracle_head_dir: Path,
) -> Iterator[Env]:
    name = request.param
    args = [a.replace("{oracle}", str(oracle_head_dir)) for a in DRAFTERS[name]]
    log_dir = tmp_path_factory.mktemp(f"spec-lossless-{name}")
    router_args = [*ROUTER_ARGS, "--max-speculative-batch", str(MAX_SPECULATIVE_BATCH[name])]
    with running_stack(log_dir, tiny_model_dir, [args], TARGET_ARGS, router_args) as (_, router):
        yield Env(name, router, Tokenizer.from_model_path(str(tiny_model_dir)))


@pytest.fixture(scope="module")
def batch(env: Env) -> Batch:
    rng = random.Random(11)
    prompts = random_prompts(seed=7, count=NUM_PROMPTS, vocab_size=env.tokenizer.vocab_size)
    max_new = [rng.choice(MAX_NEW_CHOICES) for _ in prompts]
    requests = [
        ids_request(p, n, speculate, request_id=f"{env.name}-{i}-{speculate}")
        for speculate in (True, False)
        for i, (p, n) in enumerate(zip(prompts, max_new, strict=True))
    ]
    sampled = [
        ids_request(p, SAMPLED_NEW, True, temperature=1.0, seed=i)
        for i, p in enumerate(prompts[:NUM_SAMPLED])
    ]
    # Both modes in one concurrent batch: speculative, target-only and sampled requests share
    # steps (and verify calls).
    streams = env.router.generate_many(requests + sampled)
    assert all(s.final.usage.completion_tokens == SAMPLED_NEW for s in streams[2 * NUM_PROMPTS :])
    return Batch(prompts, max_new, streams[:NUM_PROMPTS], streams[NUM_PROMPTS : 2 * NUM_PROMPTS])


def assert_same_output(spec: Stream, base: Stream, what: str) -> None:
    assert spec.token_ids == base.token_ids, f"{what}: token ids differ"
    assert spec.text == base.text, f"{what}: text differs"
    assert spec.final.finish_reason == base.final.finish_reason, what
    assert spec.final.matched_stop == base.final.matched_stop, what
    assert spec.final.usage.completion_tokens == len(spec.token_ids), what
    assert base.final.usage.completion_tokens == len(base.token_ids), what


def overshoot(stream: Stream) -> int:
    """Lower bound on the tokens the target committed but the stop rules cut: the prefill's
    token plus every verify's accepted drafts and bonus, minus what was returned."""
    s = stream.final.speculation
    return 1 + s.verify_steps + s.accepted_tokens - stream.final.usage.completion_tokens


def accepted_blocks(stream: Stream) -> list[tuple[int, int]]:
    """(offset, length) of the stream's committed blocks of 3+ tokens, the last item excluded
    (it may already be cut)."""
    out, offset = [], 0
    for block in stream.blocks[:-1]:
        if len(block) >= 3:
            out.append((offset, len(block)))
        offset += len(block)
    return out


@EVERY_DRAFTER
def test_greedy_outputs_equal_target_only(env: Env, batch: Batch) -> None:
    lengths = sorted(len(p) for p in batch.prompts)
    assert lengths[0] == 1 and lengths[-1] == 300
    for i, (spec, base) in enumerate(zip(batch.spec, batch.base, strict=True)):
        what = f"{env.name} prompt {i} ({len(batch.prompts[i])} ids, max {batch.max_new[i]})"
        assert_same_output(spec, base, what)
        assert base.final.speculation.verify_steps == 0, f"{what}: target-only request verified"
        if len(spec.token_ids) > 2:
            assert spec.final.speculation.verify_steps > 0, f"{what}: never speculated"
    reasons = {s.final.finish_reason for s in batch.base}
    assert pb.FINISH_REASON_LENGTH in reasons


@EVERY_DRAFTER
def test_drafts_were_verified_and_accepted(env: Env, batch: Batch) -> None:
    stats = [s.final.speculation for s in batch.spec]
    assert sum(s.draft_tokens for s in stats) > 0
    if env.name in ACCEPTS:
        assert sum(s.accepted_tokens for s in stats) > 0
        assert any(len(b) >= 3 for s in batch.spec for b in s.blocks)
        # Accepted blocks were streamed whole: several tokens in one item.
        assert sum(len(accepted_blocks(s)) for s in batch.spec) >= NUM_CUT_CASES


def cut_cases(batch: Batch, seed: int) -> list[tuple[int, int, int]]:
    """(prompt index, block offset, block length): one block of 3+ tokens per prompt."""
    rng = random.Random(seed)
    cases = []
    for i, spec in enumerate(batch.spec):
        blocks = accepted_blocks(spec)
        if blocks:
            cases.append((i, *rng.choice(blocks)))
    rng.shuffle(cases)
    return cases


@ACCEPTING_DRAFTERS
def test_max_new_tokens_inside_accepted_blocks(env: Env, batch: Batch) -> None:
    cases = cut_cases(batch, seed=1)[:NUM_CUT_CASES]
    assert cases
    rng = random.Random(2)
    limits = [offset + rng.randint(2, length - 1) for _, offset, length in cases]
    requests = [
        ids_request(batch.prompts[i], limit, speculate)
        for speculate in (True, False)
        for (i, _, _), limit in zip(cases, limits, strict=True)
    ]
    streams = env.router.generate_many(requests)
    for k, ((i, offset, length), limit) in enumerate(zip(cases, limits, strict=True)):
        spec, base = streams[k], streams[len(cases) + k]
        what = f"prompt {i}, limit {limit} inside block [{offset}, {offset + length})"
        assert_same_output(spec, base, what)
        assert spec.token_ids == batch.base[i].token_ids[:limit], what
        assert spec.final.finish_reason == pb.FINISH_REASON_LENGTH, what
        assert spec.final.usage.completion_tokens == limit, what
        assert overshoot(spec) >= 1, f"{what}: the limit did not cut a verified block"


@ACCEPTING_DRAFTERS
def test_stop_strings_inside_accepted_blocks(env: Env, batch: Batch) -> None:
    cases = []
    for i, offset, length in cut_cases(batch, seed=3):
        ids = batch.base[i].token_ids
        # The stop string must complete before the block's last token, so it cuts the block.
        for end in range(max(offset, 1), offset + length - 1):
            stop = stop_string_at(env.tokenizer, ids, end)
            if stop is not None:
                cases.append((i, end, stop))
                break
    cases = cases[:NUM_CUT_CASES]
    assert len(cases) >= 3
    requests = [
        ids_request(batch.prompts[i], batch.max_new[i], speculate, stop=[stop])
        for speculate in (True, False)
        for i, _, stop in cases
    ]
    streams = env.router.generate_many(requests)
    for k, (i, end, stop) in enumerate(cases):
        spec, base = streams[k], streams[len(cases) + k]
        what = f"prompt {i}, stop {stop!r} ending at token {end}"
        assert_same_output(spec, base, what)
        assert spec.final.finish_reason == pb.FINISH_REASON_STOP, what
        assert spec.final.matched_stop == stop, what
        assert spec.token_ids == batch.base[i].token_ids[: end + 1], what
        assert stop not in spec.text, what
        assert overshoot(spec) >= 1, f"{what}: the stop did not cut a verified block"


@ACCEPTING_DRAFTERS
def test_seeded_sampling_is_reproducible(env: Env, batch: Batch) -> None:
    """A seeded sampled request draws what it draws target-only, token for token (a verify
    accepts a draft where it is the target's own keyed draw), so neither its company nor
    which of its steps speculated changes its tokens."""
    prompts = batch.prompts[2:6]

    def sampled(seed: int, speculate: bool = True) -> list[pb.GenerateRequest]:
        return [
            ids_request(p, SEEDED_NEW, speculate, temperature=1.3, seed=seed + i)
            for i, p in enumerate(prompts)
        ]

    first = env.router.generate_many(sampled(100))
    # Again in other company: halves of the batch, alongside a greedy request.
    again = [
        s
        for half in (sampled(100)[:2], sampled(100)[2:])
        for s in env.router.generate_many([*half, ids_request(prompts[0], SEEDED_NEW, True)])[:2]
    ]
    plain = env.router.generate_many(sampled(100, speculate=False))
    for a, b, c in zip(first, again, plain, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.text == b.text == c.text
    if env.name == "eagle-oracle":  # n-gram finds no repeats in random ids at temperature 1.3
        assert sum(s.final.speculation.accepted_tokens for s in first) > 0
    reseeded = env.router.generate_many(sampled(900))
    assert [s.token_ids for s in reseeded] != [s.token_ids for s in first]


@ACCEPTING_DRAFTERS
def test_sampling_truncated_to_one_token_is_greedy(env: Env, batch: Batch) -> None:
    """Sampling whose filter keeps one token (top_k = 1, or a tiny top_p) goes through rejection
    sampling against one-hot distributions: every accepted draft must be the argmax, whatever
    the seed, so the output is the greedy target-only one."""
    picks = [i for i, n in enumerate(batch.max_new) if n >= 24][:4]  # two of each filter
    truncations = [{"top_k": 1}, {"top_p": 1e-6}]
    requests = [
        ids_request(
            batch.prompts[i], batch.max_new[i], True, temperature=1.0, seed=i, **truncations[k % 2]
        )
        for k, i in enumerate(picks)
    ]
    streams = env.router.generate_many(requests)
    for i, stream in zip(picks, streams, strict=True):
        assert stream.token_ids == batch.base[i].token_ids, f"prompt {i}"
    assert sum(s.final.speculation.accepted_tokens for s in streams) > 0
