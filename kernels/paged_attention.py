"""Paged attention in Triton: one kernel pair for decode, tree-verify and prefill queries.

The KV pool is paged with pages of one slot, so a request's row of the slot table is its page
table and nothing is gathered into a dense context first. Each query names its keys as a
logical sequence (see kernels/paged_reference.py): table columns up to ``prefix_len``, then its
own ``path`` (a tree node's ancestors).

A token's keys are cut into fixed chunks of CHUNK keys (split-KV, as flash-decoding does): one
program per (token, KV head, chunk) computes that chunk's partial softmax (max, sum, weighted
values) for the KV head's group of query heads, and a second kernel merges a token's chunks in
chunk order. A decode step of one request then spreads over many programs instead of one per
KV head (the first version, one program walking all keys, took 1.27 ms a layer of the Llama-8B
shape at 1,024 keys on an H200; this one about 10 us). The chunks and the merge order depend
only on the token's own keys, never on how many queries share the step or which kind of step it
is, so a token gets the same bits decoded alone, verified in a tree or prefilled in a chunk.
Loop bounds are read on the device, so both kernels sit inside captured CUDA graphs.

A tree's nodes share their committed context, and reading it once per node made a 16-node
verify's attention 4.9x a decode step's on the Llama-8B shape (919 against 189 us on the H200).
So a program's query rows are a tile of TILE_ROWS (token, head) rows, and a full chunk below
the prefix of a tile's tokens (a tree's committed context) is computed once for the tile. The
tile's shape is fixed per model, whether one of its tokens is live (a decode) or all of them
(a tree), and a row of a tensor-core product does not depend on the other rows, so sharing
keeps the bits (tests/test_paged_attention.py checks them on the GPU).

bf16/fp16 inputs go to the tensor cores in their own dtype (fp32 accumulation); fp32 inputs use
IEEE fp32 products, so an fp32 model stays fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.dot_modes import dot, dot_mode

CHUNK = 64  # keys per split: fixed (the split is part of the numerics); 64 measured best of
# 64/128/256 on the H200 (benchmarks/results/gpu_attention_chunks_2026-12-01.jsonl)
BLOCK_K = 64  # keys per inner step of a chunk: fixed for the same reason
TILE_ROWS = 64  # query rows of one program, (token, head) pairs: fixed for the same reason

# Triton compiles a variant per integer argument that is 1 or a multiple of 16: the step's
# token count, tiling, chunk count (from the step's longest context) and path width (a tree's
# node count) must not turn new prompt lengths and tree sizes into compiles in the serving
# path (on a fresh H200 the first requests of each shape waited ~0.5 s for them).
@triton.jit(do_not_specialize=["num_tokens", "tile_tokens", "spread", "num_chunks", "stride_path"])
def _chunk_kernel(
    q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, table_ptr, row_ptr, len_ptr, prefix_ptr,
    path_ptr, stride_qt, stride_qh, stride_ks, stride_kh, stride_table, stride_path,
    num_tokens, num_heads, num_chunks, tile_tokens, spread, scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
    TILE: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """Program (token, KV head, c). The token's tile (``tile_tokens`` consecutive tokens of one
    table row and one prefix) shares every full chunk below the prefix: the first ``spread``
    values of c deal those shared chunks out to the tile's members, each computing its chunks
    for the whole tile (one load of the keys for all of them). The values past ``spread`` are
    the token's own chunks from the last shared one on (the path's, and a partial last one)."""
    token = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2)
    member = token % tile_tokens
    first = token - member
    shared_chunks = tl.load(prefix_ptr + first) // CHUNK  # the same for the whole tile
    shared = c < spread
    chunk = tl.where(shared, c * tile_tokens + member, shared_chunks + c - spread)
    begin = chunk * CHUNK
    lead = tl.where(shared, first, token).to(tl.int64)  # whose key list the program reads
    num_keys = tl.load(len_ptr + lead)
    if tl.where(shared, chunk < shared_chunks, begin < num_keys):
        # Rows: (tile member, query head of this KV head's group); only the computed ones live.
        r = tl.arange(0, TILE * BLOCK_G)
        row_token = first + r // BLOCK_G
        h = r % BLOCK_G
        row_live = (h < GROUP) & tl.where(shared, r // BLOCK_G < tile_tokens, row_token == token)
        row_live = row_live & (row_token < num_tokens)
        heads = kv_head * GROUP + h
        d = tl.arange(0, BLOCK_D)
        d_ok = d < HEAD_DIM
        q = tl.load(
            q_ptr + row_token.to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh
            + d[None, :],
            mask=row_live[:, None] & d_ok[None, :], other=0.0,
        )  # fmt: skip
        row = tl.load(row_ptr + lead).to(tl.int64)
        prefix = tl.load(prefix_ptr + lead)
        end = tl.minimum(begin + CHUNK, num_keys)
        m = tl.full([TILE * BLOCK_G], float("-inf"), tl.float32)
        total = tl.zeros([TILE * BLOCK_G], tl.float32)
        acc = tl.zeros([TILE * BLOCK_G, BLOCK_D], tl.float32)
        for start in range(begin, end, BLOCK_K):
            j = start + tl.arange(0, BLOCK_K)
            valid = j < end
            in_table = j < prefix
            from_table = tl.load(
                table_ptr + row * stride_table + j, mask=valid & in_table, other=0
            )
            from_path = tl.load(
                path_ptr + lead * stride_path + (j - prefix), mask=valid & (j >= prefix), other=0
            )
            slot = tl.where(in_table, from_table, from_path).to(tl.int64)
            kv_offset = slot[:, None] * stride_ks + kv_head * stride_kh + d[None, :]
            kv_ok = valid[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_offset, mask=kv_ok, other=0.0)
            v = tl.load(v_ptr + kv_offset, mask=kv_ok, other=0.0)
            scores = dot(q, tl.trans(k), DOT)
            scores = tl.where(valid[None, :], scores * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, 1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT)
            m = m_new
        partial = (row_token.to(tl.int64) * num_heads + heads) * num_chunks + chunk
        tl.store(m_ptr + partial, m, mask=row_live)
        tl.store(l_ptr + partial, total, mask=row_live)
        tl.store(acc_ptr + partial[:, None] * BLOCK_D + d[None, :], acc, mask=row_live[:, None])


@triton.jit(do_not_specialize=["num_chunks"])
def _merge_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, len_ptr, stride_ot, stride_oh, num_heads, num_chunks,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """One program per (token, query head): its chunks merged in chunk order. (One program per
    KV head, its group of heads at once, made the Llama-8B shape's merges 212 us a step instead
    of 114 on the H200.)"""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    used = tl.cdiv(tl.load(len_ptr + token), CHUNK)
    base = (token * num_heads + head) * num_chunks
    d = tl.arange(0, BLOCK_D)
    top = tl.load(m_ptr + base)
    for c in range(1, used):
        top = tl.maximum(top, tl.load(m_ptr + base + c))
    total = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for c in range(0, used):
        weight = tl.exp(tl.load(m_ptr + base + c) - top)
        total += tl.load(l_ptr + base + c) * weight
        acc += tl.load(acc_ptr + (base + c) * BLOCK_D + d) * weight
    out = acc / total
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty),
        mask=d < HEAD_DIM,
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
    max_keys: int | None = None,
    tile_tokens: int | None = None,
) -> Tensor:
    """Same arguments and result as kernels/paged_reference.paged_attention.

    q: [T, H, D]; k_pool, v_pool: [S, Hkv, D], last dim contiguous;
    table: [R, W]; query_row, query_len, prefix_len: [T]; path: [T, P] (P >= 1). Every query
    must have query_len >= 1 and only slots inside the pool: the caller pads with the dummy slot.
    ``max_keys``: a bound on query_len known on the host (default W + P, always one); it sizes
    the grid and the scratch, never the numerics. ``tile_tokens`` (default 1): the tokens are
    cut into aligned tiles of this many (at most tokens_per_tile), each of one table row and
    one prefix_len (a tree's nodes: pass its node count); a tile reads its shared chunks once
    for all its tokens. It never changes the numerics either.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0:
        return out
    _check_layout(table, query_row, query_len, prefix_len, path)
    bound = max_keys if max_keys is not None else table.shape[1] + path.shape[1]
    num_chunks = triton.cdiv(bound, CHUNK)
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs 16 and powers of two
    block_g = triton.next_power_of_2(group)
    tile = tokens_per_tile(group)
    tile_tokens = _aligned_tile(tile_tokens or 1, tile)
    spread = triton.cdiv(num_chunks, tile_tokens)
    own = triton.cdiv(CHUNK - 1 + path.shape[1], CHUNK)  # chunks from the prefix's last full one
    m = torch.empty((num_tokens, num_heads, num_chunks), dtype=torch.float32, device=q.device)
    total = torch.empty_like(m)
    acc = torch.empty((*m.shape, block_d), dtype=torch.float32, device=q.device)
    _chunk_kernel[(num_tokens, num_kv_heads, spread + own)](
        q, k_pool, v_pool, m, total, acc, table, query_row, query_len, prefix_len, path,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), table.stride(0),
        path.stride(0), num_tokens, num_heads, num_chunks, tile_tokens, spread, head_dim**-0.5,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_G=block_g, TILE=tile,
        BLOCK_K=BLOCK_K, CHUNK=CHUNK,
        DOT=dot_mode(q.dtype),
    )  # fmt: skip
    _merge_kernel[(num_tokens, num_heads)](
        m, total, acc, out, query_len, out.stride(0), out.stride(1), num_heads, num_chunks,
        HEAD_DIM=head_dim, BLOCK_D=block_d, CHUNK=CHUNK,
    )  # fmt: skip
    return out


def tokens_per_tile(group: int) -> int:
    """Tokens in one program's block of query rows (TILE_ROWS rows of (token, query head)):
    fixed per model, so that a row is computed by the same instruction shapes in every step."""
    return max(1, TILE_ROWS // triton.next_power_of_2(group))


def _aligned_tile(run: int, most: int) -> int:
    """The largest tile of at most ``most`` tokens that divides a run, so that no tile
    straddles two runs (two trees, or two requests' draft levels)."""
    tile = min(run, most)
    while run % tile:
        tile -= 1
    return tile


def _check_layout(table: Tensor, *per_token: Tensor) -> None:
    """The kernel indexes table rows and the per-token tensors with unit strides: a view that
    is not laid out so (a flattened expand has stride 0) would be read past its end."""
    if table.stride(-1) != 1 or not all(t.is_contiguous() for t in per_token):
        raise ValueError("paged attention: table rows and per-token tensors must be contiguous")
