"""Prompt-lookup (n-gram) drafter: proposes continuations copied from the request's own context.

No model and no device: a request's context is indexed incrementally, the longest suffix n-gram
that occurred earlier is looked up, and the tokens that followed its earlier occurrences are
merged into a token tree. Lossless by construction, since the target verifies every token.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from draft_service.tree_types import DraftTree

NgramKey = tuple[int, ...]


@dataclass
class _Context:
    """One request's committed tokens and the index over them.

    `index` maps an n-gram to the positions just after its occurrences (where the continuation
    starts), oldest first, at most `max_matches_per_ngram` of them. An occurrence is indexed only
    once the token after it is committed, so the context's own suffix never matches itself.
    """

    token_ids: list[int]
    index: dict[NgramKey, list[int]] = field(default_factory=dict)


class _TrieNode:
    """A trie node aggregating the candidate continuations that pass through it."""

    __slots__ = ("token", "depth", "count", "latest_start", "children", "selected")

    def __init__(self, token: int, depth: int) -> None:
        self.token = token
        self.depth = depth
        self.count = 0
        self.latest_start = -1  # most recent occurrence through this node, for tie-breaking
        self.children: dict[int, _TrieNode] = {}
        self.selected = False

    def rank_key(self) -> tuple[int, int, int]:
        """Sort key: more frequent first, then more recent, then token id for determinism."""
        return (-self.count, -self.latest_start, self.token)


class NgramDrafter:
    """Per-request prompt-lookup drafter producing `DraftTree`s.

    Limits: a tree has at most `num_draft_tokens` nodes (root included), at most `max_breadth`
    children per node and depth at most `max_depth`. Matching tries suffix n-grams from
    `max_ngram` down to `min_ngram` tokens and uses the first (longest) one found earlier in
    the context. Per-call cost of `extend` and `propose` is independent of context length;
    memory grows with the number of distinct n-grams in the context.
    """

    def __init__(
        self,
        min_ngram: int = 1,
        max_ngram: int = 4,
        num_draft_tokens: int = 8,
        max_breadth: int = 4,
        max_depth: int = 8,
        *,
        max_matches_per_ngram: int = 16,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        for name, value in (
            ("num_draft_tokens", num_draft_tokens),
            ("max_breadth", max_breadth),
            ("max_depth", max_depth),
            ("max_matches_per_ngram", max_matches_per_ngram),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.num_draft_tokens = num_draft_tokens
        self.max_breadth = max_breadth
        self.max_depth = max_depth
        self.max_matches_per_ngram = max_matches_per_ngram
        self._contexts: dict[str, _Context] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._contexts

    def __len__(self) -> int:
        """Number of requests with live state."""
        return len(self._contexts)

    def start(self, request_id: str, token_ids: list[int]) -> None:
        """Begin tracking a request whose committed context (prompt) is `token_ids` (non-empty)."""
        if request_id in self._contexts:
            raise ValueError(f"request {request_id!r} already started")
        if not token_ids:
            raise ValueError("a request needs at least one committed token")
        context = _Context(token_ids=list(token_ids))
        self._index_from(context, 0)
        self._contexts[request_id] = context

    def extend(self, request_id: str, token_ids: list[int]) -> None:
        """Append newly committed tokens (accepted drafts plus the bonus token)."""
        context = self._contexts[request_id]
        old_len = len(context.token_ids)
        context.token_ids.extend(token_ids)
        self._index_from(context, old_len)

    def drop(self, request_id: str) -> None:
        """Forget a request; idempotent so cleanup paths may call it unconditionally."""
        self._contexts.pop(request_id, None)

    def propose(self, request_id: str) -> DraftTree:
        """Draft a tree rooted at the request's last committed token.

        Scores are the fraction of matched earlier occurrences whose continuation agrees with
        the path to the node, so they never increase along a path. A root-only tree means
        nothing matched.
        """
        context = self._contexts[request_id]
        starts = self._match_starts(context)
        root_token = context.token_ids[-1]
        if not starts:
            return DraftTree.root_only(root_token)
        root = self._build_trie(context.token_ids, starts)
        self._select(root)
        return self._to_tree(root, num_candidates=len(starts))

    def _index_from(self, context: _Context, old_len: int) -> None:
        # Position q becomes a continuation start only once token q exists: the n-grams ending
        # at q - 1 are indexed here, never the ones ending at the context's last token.
        tokens, index = context.token_ids, context.index
        for q in range(max(old_len, 1), len(tokens)):
            for n in range(self.min_ngram, min(self.max_ngram, q) + 1):
                starts = index.setdefault(tuple(tokens[q - n : q]), [])
                starts.append(q)
                if len(starts) > self.max_matches_per_ngram:
                    del starts[0]

    def _match_starts(self, context: _Context) -> list[int]:
        """Continuation starts of the longest suffix n-gram seen before, most recent first."""
        tokens = context.token_ids
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            starts = context.index.get(tuple(tokens[-n:]))
            if starts:
                return starts[::-1]
        return []

    def _continuation(self, tokens: list[int], start: int) -> list[int]:
        """The `max_depth` tokens that followed the occurrence ending just before `start`.

        When the occurrence is closer to the end than `max_depth`, the suffix repeats with
        period `len(tokens) - start`, so the copy keeps following that period instead of
        stopping short (this is what makes loops and repeated lines draft at full depth).
        """
        period = len(tokens) - start
        continuation = tokens[start : start + self.max_depth]
        while len(continuation) < self.max_depth:
            continuation.append(continuation[len(continuation) - period])
        return continuation

    def _build_trie(self, tokens: list[int], starts: list[int]) -> _TrieNode:
        root = _TrieNode(tokens[-1], depth=0)
        root.count = len(starts)
        for start in starts:
            node = root
            for token in self._continuation(tokens, start):
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _TrieNode(token, node.depth + 1)
                child.count += 1
                child.latest_start = max(child.latest_start, start)
                node = child
        return root

    def _ranked_children(self, node: _TrieNode) -> list[_TrieNode]:
        """The `max_breadth` best children of `node`; the others are never drafted."""
        return sorted(node.children.values(), key=_TrieNode.rank_key)[: self.max_breadth]

    def _select(self, root: _TrieNode) -> None:
        """Mark the best `num_draft_tokens` nodes, best-first from the root.

        A child's count never exceeds its parent's, so best-first expansion picks the same
        nodes as a global top-k by score while guaranteeing every selected node's parent is
        selected (the result is a subtree).
        """
        frontier: list[tuple[int, int, int, int, _TrieNode]] = []
        tie_breaker = itertools.count()  # the heap must never fall through to comparing nodes
        node = root
        node.selected = True
        for _ in range(self.num_draft_tokens - 1):
            for child in self._ranked_children(node):
                entry = (-child.count, -child.latest_start, child.depth, next(tie_breaker), child)
                heapq.heappush(frontier, entry)
            if not frontier:
                return
            node = heapq.heappop(frontier)[-1]
            node.selected = True

    def _to_tree(self, root: _TrieNode, num_candidates: int) -> DraftTree:
        """Lay the selected nodes out breadth-first, best sibling first."""
        token_ids, parent_indices, scores = [root.token], [-1], [1.0]
        queue: deque[tuple[_TrieNode, int]] = deque([(root, 0)])
        while queue:
            node, node_index = queue.popleft()
            for child in self._ranked_children(node):
                if child.selected:
                    queue.append((child, len(token_ids)))
                    token_ids.append(child.token)
                    parent_indices.append(node_index)
                    scores.append(child.count / num_candidates)
        return DraftTree(token_ids=token_ids, parent_indices=parent_indices, scores=scores)
