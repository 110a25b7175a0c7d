"""Offline acceptance of a draft head: the serving drafter against the target's greedy replies.

Greedy speculative decoding commits exactly the target's greedy continuation, so a recorded
continuation (with the target's feature of every token) replays a whole generation without the
target: each round the real ``EagleDrafter`` proposes a tree, the longest root path that matches
the continuation is accepted, the target's next token is the bonus, and the drafter gets the
accepted tokens with their target rows, exactly as the router relays them after a verify.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from draft_service.drafter import ContextChunk, TreeShape
from draft_service.eagle.drafter import EagleDrafter
from draft_service.eagle.head import EagleHead
from draft_service.eagle.train.collect import FeatureSet
from draft_service.tree_types import DraftTree

CHAIN = TreeShape(num_steps=4, topk=1, num_draft_tokens=5)
TREE = TreeShape(num_steps=5, topk=4, num_draft_tokens=16)


@dataclass
class Acceptance:
    """Committed tokens per verify step (bonus included), over all rounds of all sequences."""

    shape: dict[str, int]
    num_sequences: int = 0
    verify_steps: int = 0
    committed_tokens: int = 0
    accepted_at_depth: list[int] = field(default_factory=list)  # rounds accepting >= d drafts

    @property
    def mean_acceptance_length(self) -> float:
        return self.committed_tokens / max(1, self.verify_steps)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "mean_acceptance_length": round(self.mean_acceptance_length, 4)}


def accepted_path(tree: DraftTree, continuation: Sequence[int]) -> int:
    """Drafted tokens accepted greedily: the deepest root path spelling the continuation."""
    children: dict[int, dict[int, int]] = {}
    for i in range(1, tree.num_nodes):
        children.setdefault(tree.parent_indices[i], {})[tree.token_ids[i]] = i
    node, depth = 0, 0
    while depth < len(continuation):
        nxt = children.get(node, {}).get(continuation[depth])
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


@dataclass
class _Replay:
    rid: str
    tokens: list[int]
    features: torch.Tensor
    committed: int  # tokens 0..committed-1 are held by the drafter; the last one is the root


def evaluate(head: EagleHead, data: FeatureSet, shape: TreeShape, max_batch_size: int = 64,
             indices: Sequence[int] | None = None, progress: bool = False,
             prepare: Callable[[EagleDrafter], None] | None = None,
             group_size: int | None = None) -> Acceptance:
    """Replays every sequence (prompt + recorded greedy reply) through an EagleDrafter
    (``prepare``, e.g. the service's graph set-up, runs on it first), ``group_size`` sequences
    at a time (default: all at once; 1 drafts as a server does for a single stream)."""
    from tqdm import tqdm

    picked = list(range(len(data))) if indices is None else list(indices)
    num_slots = sum(int(data.lengths()[i]) for i in picked) + 1
    drafter = EagleDrafter(head, shape, num_slots, max_batch_size=max_batch_size)
    if prepare is not None:
        prepare(drafter)
    result = Acceptance({"num_steps": shape.num_steps, "topk": shape.topk,
                         "num_draft_tokens": shape.num_draft_tokens},
                        accepted_at_depth=[0] * (shape.num_steps + 1))
    live = []
    for i in picked:
        tokens, features, prompt_len = data.sequence(i)
        if len(tokens) <= prompt_len + 1:
            continue  # a one-token reply needs no verify step
        replay = _Replay(str(i), tokens.tolist(), features, prompt_len + 1)
        # After prefill the drafter holds the prompt, the first sampled token and the prompt rows.
        live.append((replay, ContextChunk(replay.rid, 0, replay.tokens[: prompt_len + 1], 0,
                                          features[:prompt_len])))
        result.num_sequences += 1
    bar = tqdm(desc=f"replay k={shape.topk}", unit="round", disable=not progress)
    group = group_size or max(1, len(live))
    for start in range(0, len(live), group):
        _replay_rounds(drafter, live[start : start + group], result, bar.update)
    bar.close()
    return result


def _replay_rounds(drafter: EagleDrafter, live: list, result: Acceptance,
                   tick: Callable[[int], object]) -> None:
    """Rounds of append + propose + offline verify until every replay in ``live`` is done."""
    while live:
        mismatched = drafter.append_many([chunk for _, chunk in live])
        assert not mismatched, mismatched
        trees = drafter.propose([r.rid for r, _ in live])
        still = []
        for (replay, _), tree in zip(live, trees, strict=True):
            chunk = _verify(replay, tree, result)
            if chunk is None:
                drafter.release(replay.rid)
            else:
                still.append((replay, chunk))
        live = still
        tick(1)


def _verify(replay: _Replay, tree: DraftTree, result: Acceptance) -> ContextChunk | None:
    """Accepts along the continuation; returns the drafter's next chunk (None when done)."""
    root = replay.committed - 1
    remaining = replay.tokens[replay.committed :]
    accepted = accepted_path(tree, remaining[:-1]) if len(remaining) > 1 else 0
    new = remaining[: accepted + 1]  # accepted drafts, then the target's bonus token
    result.verify_steps += 1
    result.committed_tokens += len(new)
    for depth in range(accepted + 1):
        result.accepted_at_depth[depth] += 1
    replay.committed += len(new)
    if replay.committed >= len(replay.tokens):
        return None
    rows = replay.features[root : root + len(new)]  # target rows of the root and the accepted
    return ContextChunk(replay.rid, root + 1, new, root, rows)


def evaluate_shapes(head: EagleHead, sets: dict[str, FeatureSet],
                    shapes: dict[str, TreeShape] | None = None, max_batch_size: int = 64,
                    progress: bool = False) -> dict[str, dict[str, object]]:
    """{set name: {shape name: acceptance}} for chain and tree (or the shapes given)."""
    shapes = shapes or {"chain": CHAIN, "tree": TREE}
    with torch.inference_mode():
        return {name: {label: evaluate(head, data, shape, max_batch_size, progress=progress)
                       .as_dict() for label, shape in shapes.items()}
                for name, data in sets.items()}
