"""Plain-torch reference of kernels/paged_attention.py: attention over a per-query key list.

Every query token t names its keys as a *logical sequence* of ``query_len[t]`` slots: the first
``prefix_len[t]`` come from its request's row of the slot table (``table[query_row[t], j]``), the
rest from its own ``path[t, j - prefix_len[t]]``. A decode or prefill token has prefix_len =
query_len (its context and itself are all in the table); a node of a draft tree has prefix_len =
the committed context and a path of its ancestors, root first, ending with itself. So a token's
keys are the same sequence whether it is decoded alone, verified in a tree or prefilled in a
chunk, which is what lets the Triton kernel give it the same bits in each (kernels/paged_attention).
"""

from __future__ import annotations

import torch
from torch import Tensor


def logical_slots(
    table: Tensor, query_row: Tensor, query_len: Tensor, prefix_len: Tensor, path: Tensor
) -> Tensor:
    """[T, L] slots of each query's logical keys (L = the longest), -1 past its length."""
    longest = int(query_len.max())
    j = torch.arange(longest, device=table.device)[None, :]
    from_table = table[query_row.long()][:, : max(longest, 1)]
    if from_table.shape[1] < longest:
        pad = from_table.new_full((from_table.shape[0], longest - from_table.shape[1]), -1)
        from_table = torch.cat([from_table, pad], 1)
    path_index = (j - prefix_len[:, None]).clamp(0, max(path.shape[1] - 1, 0))
    from_path = path.long().gather(1, path_index) if path.shape[1] else torch.full_like(j, -1)
    slots = torch.where(j < prefix_len[:, None], from_table, from_path)
    return torch.where(j < query_len[:, None], slots, -1)


def paged_attention(
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    table: Tensor,
    query_row: Tensor,
    query_len: Tensor,
    prefix_len: Tensor,
    path: Tensor,
) -> Tensor:
    """q: [T, H, D]; pools: [S, Hkv, D]; returns [T, H, D] in q's dtype (softmax in fp32)."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_pool.shape[1]
    slots = logical_slots(table, query_row, query_len, prefix_len, path)  # [T, L]
    seen = slots >= 0
    keys = k_pool[slots.clamp(min=0)].float().repeat_interleave(group, 2)  # [T, L, H, D]
    values = v_pool[slots.clamp(min=0)].float().repeat_interleave(group, 2)
    scores = torch.einsum("thd,tlhd->thl", q.float(), keys) / head_dim**0.5
    scores = scores.masked_fill(~seen[:, None, :], float("-inf"))
    weights = torch.softmax(scores, -1)
    return torch.einsum("thl,tlhd->thd", weights, values).to(q.dtype)
