"""router/forced_steps.py on the default model's tokenizer: which target-only decoding requests
get a chain of their format's forced tokens verified (a forced chain of at least MIN_CHAIN, on
a CPU target any such request, on a CUDA one only those a masked verify graph takes, up to its
batch), and which keep their Forward. (The whole stack: tests/test_eco_structured_output.py.)"""

from __future__ import annotations

import pytest

from model_runtime.loading import default_model_path
from protos import draft_pb2, target_pb2
from protos import generation_pb2 as pb
from router.forced_steps import MIN_CHAIN, ForcedSteps
from router.request import Request, SamplingOptions
from router.scheduler import Planned
from router.structured_output import compile_format
from router.tokenizer import Tokenizer

# "Answer: " is forced as a chain, then one of two words, then ". Sure: " and a digit.
REGEX = r"Answer: (yes|no)\. Sure: [0-9]"
CPU = ForcedSteps.for_target(target_pb2.TargetInfo(device="cpu", masked_verify_graph_batch=0))
CUDA = ForcedSteps.for_target(target_pb2.TargetInfo(device="cuda", masked_verify_graph_batch=2))


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def request(tokenizer: Tokenizer, rid: str, committed: str = "", constrained: bool = True,
            forced_drafts: bool = True, **options) -> Request:  # fmt: skip
    ids = tokenizer.encode(committed, add_special_tokens=False)
    constraint = compile_format(pb.StructuredOutput(regex=REGEX), tokenizer)
    assert constraint is not None
    constraint.advance(ids)
    opts = SamplingOptions(max_new_tokens=64, **{"temperature": 0.0, **options})
    req = Request(rid, [1, 2, 3], opts, forced_drafts=forced_drafts,
                  constraint=constraint if constrained else None)  # fmt: skip
    req.output_ids = ids or [5]
    return req


def decoding(*reqs: Request) -> list[Planned]:
    return [Planned(r, 1, True) for r in reqs]


def test_the_regex_forces_a_chain(tokenizer: Tokenizer) -> None:
    fresh = request(tokenizer, "a")
    assert fresh.constraint.forces_at_least(MIN_CHAIN)
    assert not request(tokenizer, "b", "Answer: ").constraint.forces_at_least(1)  # yes or no


def test_on_a_cpu_every_forcing_request_gets_a_chain(tokenizer: Tokenizer) -> None:
    forcing = request(tokenizer, "a")
    choosing = request(tokenizer, "b", "Answer: ")
    off = request(tokenizer, "c", forced_drafts=False)
    free = request(tokenizer, "d", constrained=False)
    drafted = request(tokenizer, "e")
    sampled = request(tokenizer, "f", temperature=0.8, seed=1)
    plan = decoding(forcing, choosing, off, free, drafted, sampled)
    plan.append(Planned(request(tokenizer, "g"), 5, True, prefill=True))
    trees = CPU.trees(plan, {"e": draft_pb2.DraftTree(request_id="e")})
    assert list(trees) == ["a", "f"]
    assert list(trees["a"].token_ids) == [forcing.output_ids[-1]]
    assert list(trees["a"].parent_indices) == [-1]


def test_on_cuda_only_what_the_masked_graphs_take(tokenizer: Tokenizer) -> None:
    greedy = [request(tokenizer, rid) for rid in "abc"]
    sampled = request(tokenizer, "s", temperature=0.8, seed=1)
    biased = request(tokenizer, "p", presence_penalty=0.5)
    trees = CUDA.trees(decoding(sampled, biased, *greedy), {})
    assert list(trees) == ["a", "b"]  # greedy, plain, and two: the graphs' batch
    none = ForcedSteps.for_target(target_pb2.TargetInfo(device="cuda:0"))  # no masked graphs
    assert none.trees(decoding(*greedy), {}) == {}
