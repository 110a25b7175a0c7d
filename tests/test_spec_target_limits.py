"""Speculation must respect the target's advertised limits (TargetInfo.max_batch_tokens and
max_tree_tokens).

A target started with --max-batch-tokens 1024 takes at most 1024 tree tokens per Verify. With
the router's defaults (--max-speculative-batch 32, --max-tree-tokens 64) and an EAGLE replica
drafting 64-node trees, 24 concurrent requests make a 1536-token verify batch. The router has to
keep within the limit: it cuts the trees so that together they fit. Likewise a router started
with --max-step-tokens above the target's limit must not send a prefill chunk the target refuses,
and a target started with --max-tree-tokens 48 (below the router's 64) gets trees of 48 nodes at
most: it refuses larger ones, so a router that ignored the advertised limit would fail requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos import generation_pb2 as pb
from protos import target_pb2, target_pb2_grpc
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    random_prompts,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)  # a hung service fails this module's test, not the run
MAX_BATCH_TOKENS = 1024
TREE_TOKENS = 64
TARGET_TREE_TOKENS = 48  # the target's own limit, below the drafter's and the router's
NUM_REQUESTS = 24  # 24 * 48 = 1152 tree tokens, under --max-speculative-batch 32


@pytest.fixture(scope="module")
def limited_router(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[Router]:
    drafts = [["--method", "eagle", "--num-draft-tokens", str(TREE_TOKENS)]]
    target = ["--max-batch-tokens", str(MAX_BATCH_TOKENS),
              "--max-tree-tokens", str(TARGET_TREE_TOKENS)]  # fmt: skip
    router = ["--max-step-tokens", str(2 * MAX_BATCH_TOKENS)]
    log_dir = tmp_path_factory.mktemp("spec-target-limits")
    with running_stack(log_dir, tiny_model_dir, drafts, target, router) as (stack, client):
        client.target_address = stack.target_address  # type: ignore[attr-defined]
        yield client


def test_the_target_advertises_and_enforces_its_tree_limit(limited_router: Router) -> None:
    with grpc.insecure_channel(limited_router.target_address) as channel:  # type: ignore[attr-defined]
        stub = target_pb2_grpc.TargetModelStub(channel)
        info = stub.GetInfo(target_pb2.GetInfoRequest(), timeout=10)
        assert info.max_tree_tokens == TARGET_TREE_TOKENS and not info.exact_numerics
        nodes = TARGET_TREE_TOKENS + 1
        tree = target_pb2.VerifyItem(request_id="nobody", start_pos=1, token_ids=[1] * nodes,
                                     parent_indices=[-1, *range(nodes - 1)])  # fmt: skip
        request = target_pb2.VerifyRequest(items=[tree])
        with pytest.raises(grpc.RpcError) as refused:
            stub.Verify(request, timeout=10)
        # VerifyStream (the router's path) ends with the same status.
        with pytest.raises(grpc.RpcError) as streamed:
            list(stub.VerifyStream(iter([request]), timeout=10))
    for error in (refused.value, streamed.value):
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"exceeds the target's max_tree_tokens {TARGET_TREE_TOKENS}" in error.details()


def test_verify_batches_fit_the_target(limited_router: Router) -> None:
    prompts = random_prompts(seed=3, count=NUM_REQUESTS, vocab_size=49152, max_len=20)
    base = limited_router.generate_many([ids_request(p, 6, False) for p in prompts])
    spec = limited_router.generate_many([ids_request(p, 6, True) for p in prompts])
    for s, b in zip(spec, base, strict=True):
        assert s.token_ids == b.token_ids
        assert s.final.finish_reason == b.final.finish_reason != pb.FINISH_REASON_ABORT
    assert sum(s.final.speculation.verify_steps for s in spec) > 0


def test_prefill_chunks_fit_the_target(limited_router: Router) -> None:
    prompt = random_prompts(seed=4, count=2, vocab_size=49152, max_len=MAX_BATCH_TOKENS + 400)[1]
    assert len(prompt) > MAX_BATCH_TOKENS
    spec, base = limited_router.generate_many(
        [ids_request(prompt, 6, True), ids_request(prompt, 6, False)]
    )
    assert spec.token_ids == base.token_ids
    assert spec.final.finish_reason == pb.FINISH_REASON_LENGTH
