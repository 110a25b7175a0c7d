"""Token trees that drafters propose and the target verifies."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    """A tree of draft tokens in topological order, rooted at the last committed token.

    Invariants (checked by `validate`, not on construction, so that hot paths building
    known-good trees pay nothing and receivers can check untrusted trees explicitly):

    - `token_ids` and `parent_indices` have the same length N >= 1.
    - Index 0 is the root: the request's last committed token, which the caller supplies
      and the target has already accepted; `parent_indices[0] == -1`.
    - For i > 0, `0 <= parent_indices[i] < i`, so every parent precedes its children.
    - Children of one node carry distinct tokens (a path is identified by its tokens).
    - `scores`, when given, has length N, `scores[0] == 1.0` and every score lies in [0, 1];
      it estimates the probability that the path from the root to that node is accepted.
    """

    token_ids: list[int]
    parent_indices: list[int]
    scores: list[float] | None = None

    @classmethod
    def root_only(cls, root_token: int) -> DraftTree:
        """A tree that drafts nothing: verification then yields exactly one new token."""
        return cls(token_ids=[root_token], parent_indices=[-1], scores=[1.0])

    @property
    def num_nodes(self) -> int:
        """Number of nodes, root included."""
        return len(self.token_ids)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path in edges: 0 for a root-only tree."""
        return max(self.node_depths())

    def node_depths(self) -> list[int]:
        """Depth of every node (root 0); relies on the topological order."""
        depths = [0] * self.num_nodes
        for i in range(1, self.num_nodes):
            depths[i] = depths[self.parent_indices[i]] + 1
        return depths

    def validate(self) -> None:
        """Raise ValueError if any invariant in the class docstring is violated."""
        num_nodes = len(self.token_ids)
        if num_nodes < 1:
            raise ValueError("DraftTree needs at least the root node")
        if len(self.parent_indices) != num_nodes:
            raise ValueError(
                f"parent_indices has {len(self.parent_indices)} entries, expected {num_nodes}"
            )
        if self.parent_indices[0] != -1:
            raise ValueError(f"root parent must be -1, got {self.parent_indices[0]}")
        self._validate_edges()
        if self.scores is not None:
            self._validate_scores()

    def _validate_edges(self) -> None:
        seen: set[tuple[int, int]] = set()
        for i, (token, parent) in enumerate(zip(self.token_ids, self.parent_indices, strict=True)):
            if token < 0:
                raise ValueError(f"node {i} has negative token id {token}")
            if i == 0:
                continue
            if not 0 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; parents must precede children")
            if (parent, token) in seen:
                raise ValueError(f"node {i} duplicates token {token} among children of {parent}")
            seen.add((parent, token))

    def _validate_scores(self) -> None:
        assert self.scores is not None
        if len(self.scores) != len(self.token_ids):
            raise ValueError(
                f"scores has {len(self.scores)} entries, expected {len(self.token_ids)}"
            )
        if self.scores[0] != 1.0:
            raise ValueError(f"root score must be 1.0, got {self.scores[0]}")
        for i, score in enumerate(self.scores):
            if not 0.0 <= score <= 1.0:
                raise ValueError(f"node {i} score {score} outside [0, 1]")
