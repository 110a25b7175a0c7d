"""Target-only steps that verify what a request's format forces next (SGLang's "jump-forward",
kept exact).

A constrained request that a step would decode plainly (speculation off or switched off, no
draft replica, or its replica skipped this round) gets a one-node tree instead when its format
forces at least MIN_CHAIN tokens next (a tool call's markup and name, a schema's long key):
the router grows the tree by them (router/grammar_tree.py) and the target verifies the chain
in one pass, so the step commits the forced tokens and the token after them where a Forward
would commit one. A verified node never changes what the target emits, so the output is the
Forward's.

When it pays (bench_structured, CPU): tool calls with ``tool_choice: required``, long chains,
2.26x target-only without it (2026-12-05 00:04); an extraction schema's one-token keys, 1.00x
(2026-12-04 23:46: a CPU verify of two nodes costs about two decode steps), hence MIN_CHAIN.
On CUDA a masked verify replays a graph only greedy, without penalties, and up to the
target's ``masked_verify_graph_batch`` trees; any other runs eagerly, several decode steps'
time, so there only those requests get chains, and no more of them than that batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from protos import draft_pb2, target_pb2
from router.request import Request

if TYPE_CHECKING:
    from router.scheduler import Planned

MIN_CHAIN = 2  # forced tokens a chain needs to be verified rather than decoded


@dataclass
class ForcedSteps:
    eager_is_fine: bool  # a CPU target: every verify runs eagerly, as every decode step does
    graph_batch: int  # CUDA: greedy masked verifies of up to this many trees replay graphs

    @classmethod
    def for_target(cls, info: target_pb2.TargetInfo) -> ForcedSteps:
        return cls(not info.device.startswith("cuda"), info.masked_verify_graph_batch)

    def trees(
        self, plan: list[Planned], drafted: dict[str, draft_pb2.DraftTree]
    ) -> dict[str, draft_pb2.DraftTree]:
        """One-node trees, by request id, for the step's decoding requests without a drafted
        tree whose format forces a chain next."""
        reqs = [p.req for p in plan if not p.prefill and p.req.request_id not in drafted]
        reqs = [r for r in reqs if r.forced_drafts and r.constraint is not None]
        if not self.eager_is_fine:
            reqs = [r for r in reqs if _replays(r)]
        chains = [r for r in reqs if r.constraint.forces_at_least(MIN_CHAIN)]
        if not self.eager_is_fine:
            chains = chains[: self.graph_batch]
        return {
            r.request_id: draft_pb2.DraftTree(
                request_id=r.request_id, token_ids=[r.output_ids[-1]], parent_indices=[-1]
            )
            for r in chains
        }


def _replays(req: Request) -> bool:
    """Whether the target's masked verify graphs take the request (greedy, logits unchanged
    but for the mask: target_service/engine.py's _fits_verify_graphs)."""
    o = req.options
    changed = o.presence_penalty or o.frequency_penalty or o.logit_bias or req.min_tokens_binds
    return o.temperature == 0 and o.repetition_penalty == 1.0 and not changed
