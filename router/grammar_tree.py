"""A draft tree under a request's structured-output grammar: the nodes the target could accept,
each one's mask, and the tokens the grammar forces where the drafter's tree runs out.

Each live node's mask is the grammar's state after the node's path root .. node, found by
walking the tree with the request's matcher and rolling back, so a verified position is masked
exactly as sequential decoding would mask it. A node whose token the grammar forbids at its
parent is never accepted, and nothing after an EOS is read: those subtrees are dropped.

Forced tokens (SGLang calls following them "jump-forward"): where the grammar allows only one
text next (a schema's key, the rest of a ``choice`` once its start is unambiguous), llguidance
names the tokens that write it. The drafter does not know the format, so it drafts what the
model would write unconstrained and the grammar drops it; the walk then hangs the forced tokens
under each live leaf, in the room the tree has (the router's tree limit, the dropped nodes
freeing theirs). A node added to a tree never changes what the target emits (a node is
accepted only where it is the target's own pick, target_service/verify.py), and a forced
token is llguidance's tokenization of text the model must write, so it is accepted whenever
its parent is and the model tokenizes the text alike (tests/test_eco_structured_output.py
checks that every forced token of a target-only run was accepted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import takewhile

import llguidance


class GrammarTree:
    """One walk over a draft tree (built, walked once by ``live``, then read)."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        mask: Callable[[], bytes],
        eos: frozenset[int],
        tokens: Sequence[int],
        parents: Sequence[int],
    ) -> None:
        self._matcher, self._mask, self._eos = matcher, mask, eos
        self.tokens, self.parents = list(tokens), list(parents)
        self.masks: list[bytes | None] = [None] * len(tokens)
        self.children: list[list[int]] = [[] for _ in tokens]
        self.subtree = [1] * len(tokens)  # nodes under each (itself included)
        for node in range(len(tokens) - 1, 0, -1):  # a parent precedes its children
            self.children[parents[node]].insert(0, node)
            self.subtree[parents[node]] += self.subtree[node]
        self.room = 0  # nodes that may still be added
        self.growing = False  # whether forced tokens may be added at all
        self.num_forced = 0  # nodes added

    def live(self, grow_to: int) -> tuple[list[int], list[int], bytes]:
        """The live tree, re-indexed, with its masks node-major (VerifyItem.allowed_tokens);
        forced tokens added while it has fewer than ``grow_to`` nodes (0: none added); the
        matcher left as it was."""
        self.growing = grow_to > 0
        self.room = grow_to - len(self.tokens)
        self.masks[0] = self._mask()
        self._walk(0)
        live = [node for node, mask in enumerate(self.masks) if mask is not None]
        index = {node: i for i, node in enumerate(live)}  # a parent precedes its children
        parents = [-1] + [index[self.parents[node]] for node in live[1:]]
        masks = b"".join(self.masks[n] for n in live)  # type: ignore[misc]
        return [self.tokens[n] for n in live], parents, masks

    def _walk(self, node: int) -> None:
        """Fills the masks of ``node``'s live descendants (a live node's parent is live);
        forced tokens extend a live leaf."""
        ended = self._matcher.is_stopped()  # only EOS may follow, and it ends the request
        any_live = False
        for child in self.children[node]:
            token = self.tokens[child]
            if not allows(self.masks[node], token):  # type: ignore[arg-type]
                self.room += self.subtree[child]  # never accepted: dropped with its subtree
                continue
            any_live = True
            if ended or token in self._eos:
                self.masks[child] = self.masks[node]  # a stand-in: the request ends here
                self.room += self.subtree[child] - 1
                continue
            self._matcher.consume_token(token)
            self.masks[child] = self._mask()
            self._walk(child)
            self._matcher.rollback(1)
        if not (any_live or ended) and self.growing and self.room > 0:
            self._force(node)

    def _force(self, node: int) -> None:
        """Hangs the tokens the grammar forces after ``node`` under it, as a chain."""
        forced = list(takewhile(lambda t: t not in self._eos, self._matcher.compute_ff_tokens()))
        forced = forced[: self.room]
        for token in forced:
            self._matcher.consume_token(token)
            self.tokens.append(token)
            self.parents.append(node)
            self.masks.append(self._mask())
            node = len(self.tokens) - 1
        self._matcher.rollback(len(forced))
        self.room -= len(forced)
        self.num_forced += len(forced)


def allows(mask: bytes, token: int) -> bool:
    byte = token >> 3
    return byte < len(mask) and bool(mask[byte] >> (token & 7) & 1)
