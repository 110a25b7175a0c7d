"""Attention over a slot-indexed KV pool: one metadata object per step, shared by all layers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from model_runtime.paged import PagedMetadata, paged_attention


@dataclass
class AttentionMetadata:
    """Where each token of a step reads and writes, in padded [batch, ...] layout.

    T is the number of tokens in the step (requests concatenated), B the number of requests,
    Q the most new tokens of one request, K the longest context (table length) in the step.
    """

    write_slots: torch.Tensor  # [T] slot receiving each token's K/V
    query_index: torch.Tensor  # [B, Q] index into the T tokens; padding points at row T
    key_slots: torch.Tensor  # [B, K] each request's context slots; padding is the dummy slot
    allowed: torch.Tensor  # [B, 1, Q, K] bool: query may attend to key
    token_rows: torch.Tensor  # [T] position of each token in the flattened [B * Q] layout


def build_metadata(
    write_slots: torch.Tensor,
    key_slots: torch.Tensor,
    start_pos: torch.Tensor,
    num_new: torch.Tensor,
    num_query: int,
    new_token_mask: torch.Tensor | None = None,
) -> AttentionMetadata:
    """Builds metadata on the device of ``key_slots``.

    start_pos[b]: context index of request b's first new token (its keys below that index are
    committed and fully visible). num_new[b]: new tokens of request b. new_token_mask
    [B, Q, Q]: which new tokens each new token sees (causal when None; a tree's ancestor
    matrix when verifying a draft tree).
    """
    device = key_slots.device
    num_req, num_key = key_slots.shape
    q = torch.arange(num_query, device=device)
    k = torch.arange(num_key, device=device)
    is_real_query = q[None, :] < num_new[:, None]  # [B, Q]
    rel = k[None, None, :] - start_pos[:, None, None]  # [B, 1, K] key index relative to start
    if new_token_mask is None:
        new_part = (rel >= 0) & (rel <= q[None, :, None])
    else:
        in_block = (rel >= 0) & (rel < num_query)
        gather_idx = rel.clamp(0, num_query - 1).expand(num_req, num_query, num_key)
        new_part = in_block & new_token_mask.gather(2, gather_idx)
    allowed = (rel < 0) | new_part
    allowed = allowed & is_real_query[:, :, None]
    # Padding queries attend to key 0 only, so softmax never sees an all-masked row.
    allowed[:, :, 0] |= ~is_real_query
    offsets = torch.cumsum(num_new, 0) - num_new
    query_index = torch.where(is_real_query, offsets[:, None] + q[None, :], write_slots.numel())
    flat_rows = torch.arange(num_req, device=device)[:, None] * num_query + q[None, :]
    token_rows = flat_rows[is_real_query]
    return AttentionMetadata(write_slots, query_index, key_slots, allowed[:, None], token_rows)


def slot_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    meta: AttentionMetadata | PagedMetadata,
) -> torch.Tensor:
    """Writes this step's K/V into the pool, then attends. q: [T, H, D]; returns [T, H, D].

    The metadata's type picks the backend: this torch one, or the paged Triton one
    (model_runtime/paged.py) that the target uses on CUDA.
    """
    if isinstance(meta, PagedMetadata):
        return paged_attention(q, k_new, v_new, k_pool, v_pool, meta)
    k_pool.index_copy_(0, meta.write_slots, k_new)
    v_pool.index_copy_(0, meta.write_slots, v_new)
    num_tokens, num_heads, head_dim = q.shape
    q_padded = torch.cat([q, q.new_zeros(1, num_heads, head_dim)])[meta.query_index]
    keys = k_pool[meta.key_slots].transpose(1, 2)  # [B, Hkv, K, D]
    values = v_pool[meta.key_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q_padded.transpose(1, 2), keys, values, attn_mask=meta.allowed, enable_gqa=True
    )  # [B, H, Q, D]
    out = out.transpose(1, 2).reshape(-1, num_heads, head_dim)
    return out[meta.token_rows]
