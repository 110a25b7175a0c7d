"""Token-tree layout, greedy verification and KV compaction for tree speculative decoding.

The plain-torch implementation lives in kernels/tree_reference.py (the reference that the Triton
kernels in kernels/tree_kernels.py are tested against); this module keeps the target's names.
kernels/tree_ops.py picks Triton on CUDA and these functions elsewhere.
"""

from kernels.tree_reference import (
    Acceptance,
    TreeLayout,
    TreeMask,
    accepted_path,
    compact_accepted,
    draft_nodes,
    first_among_siblings,
    greedy_accept,
    greedy_accept_path,
    last_on_path,
    sibling_before,
    tree_attention_mask,
    tree_mask_and_positions,
)

__all__ = [
    "Acceptance",
    "TreeLayout",
    "TreeMask",
    "accepted_path",
    "compact_accepted",
    "draft_nodes",
    "first_among_siblings",
    "greedy_accept",
    "greedy_accept_path",
    "last_on_path",
    "sibling_before",
    "tree_attention_mask",
    "tree_mask_and_positions",
]
