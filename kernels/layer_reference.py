"""Plain-torch references of kernels/layer_ops.py: the same functions composed from the ops
they merge (kernels/fused_reference.py and torch's add and index copy)."""

from __future__ import annotations

from torch import Tensor

from kernels import fused_reference


def rope_and_store(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    write_slots: Tensor,
    k_pool: Tensor,
    v_pool: Tensor,
    num_heads: int,
) -> Tensor:
    num_tokens = qkv.shape[0]
    num_kv_heads, head_dim = k_pool.shape[1], k_pool.shape[2]
    q, k, v = qkv.view(num_tokens, -1, head_dim).split([num_heads, num_kv_heads, num_kv_heads], 1)
    cos, sin = cos.reshape(num_tokens, 1, head_dim), sin.reshape(num_tokens, 1, head_dim)
    k_pool.index_copy_(0, write_slots, fused_reference.rotary(k, cos, sin))
    v_pool.index_copy_(0, write_slots, v)
    return fused_reference.rotary(q, cos, sin)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    total = x + residual
    return fused_reference.rms_norm(total, weight, eps), total


def silu_mul_halves(gate_up: Tensor) -> Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return fused_reference.silu_mul(gate, up)
