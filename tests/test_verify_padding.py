"""A verify batch of trees of different sizes (padded) commits what each tree commits alone.

run_verify takes a shortcut when no tree is padded (logits straight from the model, no zero
fill and scatter); batching a 5-node and a 2-node tree takes the other path, alone each takes
the shortcut, and both must agree. No gRPC: a TargetEngine on the tiny fp64 model in-process.
"""

from __future__ import annotations

from pathlib import Path

import torch

from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.request_table import SamplingSpec
from target_service.step_results import VerifyResult
from tests.helpers.spec_fixtures import greedy_reference, load_fp64
from tests.helpers.tiny_llama import tiny_model_dir_fixture  # noqa: F401 (fixture)

PROMPTS = [[5, 6, 7, 8, 9, 10], [20, 21, 22]]
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
Tree = tuple[list[int], list[int]]  # token ids, parent indices


def make_trees(greedy: list[list[int]]) -> list[Tree]:
    """Request 0: a chain of its 4 greedy tokens (all accepted). Request 1: one wrong draft."""
    chain = ([PROMPTS[0][-1], *greedy[0][:4]], [-1, 0, 1, 2, 3])
    wrong = (greedy[1][0] + 1) % 49152
    return [chain, ([PROMPTS[1][-1], wrong], [-1, 0])]


def verify(model_dir: Path, all_trees: list[Tree], which: list[int]) -> list[VerifyResult]:
    """Prefills the chosen requests on a fresh engine, then verifies their trees in one call."""
    config = TargetConfig(model_path=model_dir, cache_dir=model_dir, dtype="float64", num_slots=64)
    engine = TargetEngine(config, load_fp64(model_dir))
    chosen = [(f"r{i}", PROMPTS[i], all_trees[i]) for i in which]
    slot = iter(range(64))
    engine.forward(
        [
            StepItem(rid, prompt[:-1], 0, [next(slot) for _ in prompt[:-1]], False, GREEDY)
            for rid, prompt, _ in chosen
        ]
    )
    results, *_ = engine.verify(
        [
            VerifyItem(rid, len(prompt) - 1, tokens, parents, [next(slot) for _ in tokens], True)
            for rid, prompt, (tokens, parents) in chosen
        ]
    )
    return results


def test_padded_batch_commits_what_each_tree_commits_alone(tiny_model_dir: Path) -> None:
    greedy = greedy_reference(tiny_model_dir, PROMPTS, 5)
    trees = make_trees(greedy)
    together = verify(tiny_model_dir, trees, [0, 1])
    alone = [verify(tiny_model_dir, trees, [i])[0] for i in (0, 1)]
    assert [r.num_accepted for r in together] == [4, 0]
    for batched, single in zip(together, alone, strict=True):
        assert batched.token_ids == single.token_ids
        assert batched.num_accepted == single.num_accepted
        assert batched.hidden is not None and single.hidden is not None
        torch.testing.assert_close(batched.hidden, single.hidden, rtol=1e-12, atol=1e-12)
    assert together[0].token_ids == greedy[0][:5]
    assert together[1].token_ids == greedy[1][:1]
