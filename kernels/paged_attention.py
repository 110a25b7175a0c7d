"""Paged attention in Triton: one kernel for decode, tree-verify and prefill queries.

The KV pool is paged with pages of one slot, so a request's row of the slot table is its page
table and nothing is gathered into a dense context first. Each query names its keys as a
logical sequence (see kernels/paged_reference.py): table columns up to ``prefix_len``, then its
own ``path`` (a tree node's ancestors). One program handles one query token and one KV head
(with that head's group of query heads) and walks the logical keys in blocks of BLOCK_K from
the first, with an online softmax. The order of that walk depends only on the token's keys,
never on how many queries share the step or which kind of step it is, so a token gets the same
bits decoded alone, verified in a tree or prefilled in a chunk. Loop bounds are read on the
device, so the kernel sits inside captured CUDA graphs with any context length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_K = 64  # keys per inner step: fixed, since the block split is part of the numerics


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, table_ptr, row_ptr, len_ptr, prefix_ptr, path_ptr,
    stride_qt, stride_qh, stride_ks, stride_kh, stride_ot, stride_oh, stride_table, stride_path,
    scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    head_ok = h < GROUP
    heads = kv_head * GROUP + h
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + token * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=head_ok[:, None], other=0.0,
    ).to(tl.float32)  # fmt: skip
    row = tl.load(row_ptr + token).to(tl.int64)
    num_keys = tl.load(len_ptr + token)
    prefix = tl.load(prefix_ptr + token)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for start in range(0, num_keys, BLOCK_K):
        j = start + tl.arange(0, BLOCK_K)
        valid = j < num_keys
        in_table = j < prefix
        from_table = tl.load(table_ptr + row * stride_table + j, mask=valid & in_table, other=0)
        from_path = tl.load(
            path_ptr + token * stride_path + (j - prefix), mask=valid & (j >= prefix), other=0
        )
        slot = tl.where(in_table, from_table, from_path).to(tl.int64)
        kv_offset = slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
        k = tl.load(k_ptr + kv_offset, mask=valid[:, None], other=0.0).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        scores = tl.where(valid[None, :], scores * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_offset, mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m = m_new
    out = acc / total[:, None]
    tl.store(
        out_ptr + token * stride_ot + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None],
    )  # fmt: skip


def paged_attention(
    q: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    table: Tensor,
    query_row: Tensor,
    query_len: Tensor,
    prefix_len: Tensor,
    path: Tensor,
    out: Tensor | None = None,
) -> Tensor:
    """Same arguments and result as kernels/paged_reference.paged_attention.

    q: [T, H, D] (D a power of two); k_pool, v_pool: [S, Hkv, D], last dim contiguous;
    table: [R, W]; query_row, query_len, prefix_len: [T]; path: [T, P] (P >= 1). Every query
    must have query_len >= 1 and only slots inside the pool: the caller pads with the dummy slot.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0:
        return out
    _paged_attention_kernel[(num_tokens, num_kv_heads)](
        q, k_pool, v_pool, out, table, query_row, query_len, prefix_len, path,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), out.stride(0),
        out.stride(1), table.stride(0), path.stride(0), head_dim**-0.5,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_K=BLOCK_K,
    )  # fmt: skip
    return out
