"""A request whose prefix comes from the radix cache gets its drafter's context rebuilt from the
target's hidden pool.

The recording replica writes what it receives per request. Request A computes a prompt; request
B shares its first SHARED ids, so B's prefill runs only on its own tail. B's drafter must
nevertheless receive B's whole context (prompt + first generated token) and one hidden row per
prompt position, the shared ones being the very rows A's drafter received (same pool slots),
and all of them the target's real hidden states, as a direct forward of the model in this
process computes them.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from draft_service.test_drafters import record_path
from protos import generation_pb2 as pb
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    hidden_states,
    ids_request,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)  # a hung service fails this module's test, not the run
SHARED = 240
RTOL = 1e-9


@dataclass
class Env:
    router: Router
    record_dir: Path
    model_dir: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Env]:
    log_dir = tmp_path_factory.mktemp("spec-catch-up")
    record_dir = log_dir / "records"
    drafts = [["--method", "recording", "--record-dir", str(record_dir)]]
    # What the drafter receives is under test, not its deadlines: on a loaded CI box a 6 ms
    # adaptive deadline was missed once, the replica was suspected, and B (two tokens) was
    # never caught up, so its record did not exist.
    router_args = ["--draft-deadline-floor", "5"]
    with running_stack(log_dir, tiny_model_dir, drafts, router_args=router_args) as (_, router):
        yield Env(router, record_dir, tiny_model_dir)


def read_record(env: Env, request_id: str, timeout_s: float = 10.0) -> dict:
    """The request's final record: once the router has released its draft state, which it
    does when the request finishes (just after the stream's last item)."""
    deadline = time.monotonic() + timeout_s
    while True:
        record = json.loads(record_path(env.record_dir, request_id).read_text())
        if record["released"]:
            return record
        assert time.monotonic() < deadline, f"{request_id}: draft state never released"
        time.sleep(0.02)


def run(env: Env, request_id: str, prompt: list[int], max_new: int) -> list[int]:
    stream = env.router.generate(
        ids_request(prompt, max_new, True, request_id=request_id, ignore_eos=True)
    )
    final = stream.final
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert final.usage.prompt_tokens == len(prompt)
    return stream.token_ids


def row_sums(model_dir: Path, ids: list[int]) -> list[float]:
    return hidden_states(model_dir, ids).sum(dim=1).tolist()


def test_cached_prefix_context_is_rebuilt_from_the_hidden_pool(env: Env) -> None:
    rng = random.Random(4)
    prompt_a = [rng.randrange(49152) for _ in range(SHARED + 30)]
    prompt_b = prompt_a[:SHARED] + [rng.randrange(49152) for _ in range(25)]
    run(env, "catch-up-a", prompt_a, 24)
    stream_b = env.router.generate(
        ids_request(prompt_b, 2, True, request_id="catch-up-b", ignore_eos=True)
    )
    assert stream_b.final.usage.cached_tokens >= 200
    assert stream_b.final.usage.cached_tokens <= SHARED
    out_b = stream_b.token_ids
    rec_a, rec_b = read_record(env, "catch-up-a"), read_record(env, "catch-up-b")

    # B's drafter got its whole context in one catch-up: prompt + first token, prompt_len rows.
    assert rec_b["num_starts"] == 1 and rec_b["num_mismatches"] == 0
    assert rec_b["token_ids"] == prompt_b + out_b[:1]
    assert rec_b["num_hidden_rows"] == len(prompt_b)
    assert len(rec_b["hidden_row_sums"]) == len(prompt_b)
    assert rec_b["chunks"][0]["start_pos"] == 0

    # Over the shared prefix, B's rows are A's rows: the same slots of the target's hidden pool.
    sums_a, sums_b = rec_a["hidden_row_sums"], rec_b["hidden_row_sums"]
    assert sums_b[:SHARED] == pytest.approx(sums_a[:SHARED], rel=RTOL, abs=1e-12)
    assert sums_b[SHARED:] != pytest.approx(sums_a[SHARED : len(sums_b)], rel=1e-3)

    # And they are the target's real hidden states (not zeros, not stale rows).
    assert all(abs(s) > 1e-6 for s in sums_b)
    direct_b = row_sums(env.model_dir, prompt_b)
    assert sums_b == pytest.approx(direct_b, rel=RTOL, abs=1e-9)


def test_rows_returned_by_verify_are_real_hidden_states(env: Env) -> None:
    """Each record also holds the rows every verify sent back for its accepted path (compacted
    into the committed positions on the target): over prompt + output they must match a direct
    forward too, including where drafts were accepted."""
    prompts = random_prompts(seed=12, count=8, vocab_size=49152, max_len=60)
    rids = [f"verify-rows-{i}" for i in range(len(prompts))]
    streams = env.router.generate_many(
        [
            ids_request(p, 64, True, request_id=rid, ignore_eos=True)
            for p, rid in zip(prompts, rids, strict=True)
        ]
    )
    assert sum(s.final.speculation.accepted_tokens for s in streams) > 0
    for prompt, rid, stream in zip(prompts, rids, streams, strict=True):
        rec = read_record(env, rid)
        held = rec["token_ids"]
        assert held == (prompt + stream.token_ids)[: len(held)]
        assert len(held) > len(prompt) + 16, "too few rounds reached the drafter"
        assert rec["num_hidden_rows"] == len(held) - 1 == len(rec["hidden_row_sums"])
        direct = row_sums(env.model_dir, held[:-1])
        assert rec["hidden_row_sums"] == pytest.approx(direct, rel=RTOL, abs=1e-9), rid
