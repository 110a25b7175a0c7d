"""A draft replica built for another target stays out of rotation, with the reason.

Before, an EAGLE head for another model (hidden rows of another width) joined as healthy: every
step's Ingest was refused, one error line per request per step, and nothing was ever drafted.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from protos import draft_pb2, target_pb2
from router.replica_check import draft_misfit
from splitspec.launcher import LocalStack
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    FP64,
    START_TIMEOUT_S,
    Router,
    ids_request,
    tiny_model_dir_fixture,
)
from tests.helpers.tiny_llama import E2E_MODEL, tiny_llama_dir, write_oracle_head

pytestmark = pytest.mark.timeout(180)
PROMPT = list(range(1, 40))


def test_an_eagle_head_for_another_model_is_kept_out_with_the_reason(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    wider = tiny_llama_dir(tmp_path, replace(E2E_MODEL, hidden_size=64, intermediate_size=128))
    head = write_oracle_head(wider, tmp_path / "wider-head")
    draft = ["--method", "eagle", "--eagle-head", str(head), "--model", str(wider), *FP64]
    stack = LocalStack(
        ["--model", str(tiny_model_dir), *FP64],
        ["--model", str(tiny_model_dir)],
        log_dir=tmp_path,
        draft_args=[draft],
    )
    # Not stack.start(): it waits for the drafts to serve, which this one never does.
    stack.launch()
    router = None
    try:
        for service in stack.services():
            service.wait_healthy(START_TIMEOUT_S)
        router = Router(stack.router_address)
        replica = probed_while_up(router)
        target_only = router.generate(ids_request(PROMPT, 16, False)).token_ids
        asked = router.generate(ids_request(PROMPT, 16, True))
    finally:
        if router is not None:
            router.close()
        stack.stop()

    assert not replica.healthy
    assert "built for another target: it reads hidden rows of width 64, the target's are 32" in (
        replica.error
    )
    assert asked.token_ids == target_only
    assert asked.final.speculation.draft_tokens == 0
    log = (tmp_path / "router.log").read_text()
    assert "refused the context" not in log, "the misfit was called"
    assert log.count("built for another target") == 1, "said once, not every probe"


def probed_while_up(router: Router, timeout_s: float = 30.0):
    """The only replica's status once the router has probed it while it served: its error is
    neither the placeholder it starts with nor the "unreachable" of a probe sent before the
    replica listened (the router starts beside it and probes again each second)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (replica,) = router.status().draft_replicas
        if replica.error != "not probed yet" and not replica.error.startswith("unreachable"):
            return replica
        time.sleep(0.1)
    raise TimeoutError(f"the router never probed its replica while it served: {replica.error}")


def test_a_vocabulary_of_another_size_is_a_misfit() -> None:
    target = target_pb2.TargetInfo(vocab_size=49152, hidden_size=576)
    ngram = draft_pb2.DraftInfo(method="ngram")
    eagle = draft_pb2.DraftInfo(method="eagle", needs_hidden=True, hidden_size=576)
    assert draft_misfit(ngram, target) == ""
    assert draft_misfit(replace_info(eagle, vocab_size=49152), target) == ""
    other_vocab = draft_misfit(replace_info(eagle, vocab_size=32000), target)
    assert "vocabulary has 32000 tokens, the target's 49152" in other_vocab
    other_width = draft_misfit(replace_info(eagle, vocab_size=49152, hidden_size=960), target)
    assert "hidden rows of width 960, the target's are 576" in other_width


def replace_info(info: draft_pb2.DraftInfo, **fields: int) -> draft_pb2.DraftInfo:
    copy = draft_pb2.DraftInfo()
    copy.CopyFrom(info)
    for name, value in fields.items():
        setattr(copy, name, value)
    return copy
