"""The GPU decoder body: merged projections and merged small kernels, same function as
LlamaForCausalLM's layer loop.

At load time ``merge_projections`` concatenates q|k|v and gate|up into one weight each (the
original parameters become views into it, so no memory is added), turning five matmuls a layer
into two. ``fused_body`` then runs a layer as: add+RMSNorm, qkv matmul, rope+KV store, paged
attention, o matmul, add+RMSNorm, gate|up matmul, SiLU*mul, down matmul: nine launches where
the plain loop takes seventeen. The residual add of each layer is carried into the next
layer's norm. Used when the model's projections are merged and the step's metadata is paged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn

from model_runtime import invariant
from model_runtime.paged import PagedMetadata, cuda_attention

if TYPE_CHECKING:  # llama.py imports this module
    from model_runtime.llama import DecoderLayer, LlamaForCausalLM


class DecoderLayers(Protocol):
    """What these functions use of an nn.ModuleList of DecoderLayers (the target's or the
    EAGLE head's): torch types its items as plain Modules."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[DecoderLayer]: ...
    def __getitem__(self, index: int) -> DecoderLayer: ...


def merge_projections(model: LlamaForCausalLM) -> None:
    """Concatenates each layer's q|k|v and gate|up weights (in place; CUDA path)."""
    merge_layer_projections(model.model.layers)


def merge_layer_projections(layers: nn.ModuleList) -> None:
    """merge_projections for a bare list of decoder layers (the EAGLE head's)."""
    for layer in cast(DecoderLayers, layers):
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_weight = _merged([attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.gate_up_weight = _merged([mlp.gate_proj, mlp.up_proj])


def _merged(linears: list[nn.Linear]) -> torch.Tensor:
    weight = torch.cat([m.weight.data for m in linears])
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight.data = weight[start : start + rows]  # a view: the merged copy is the only one
        start += rows
    return weight


def is_merged(model: LlamaForCausalLM) -> bool:
    return layers_merged(model.model.layers)


def layers_merged(layers: nn.ModuleList) -> bool:
    return getattr(layers[0].self_attn, "qkv_weight", None) is not None


def fused_body(
    module_list: nn.ModuleList,
    x: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    kv_pools: tuple[list[torch.Tensor], list[torch.Tensor]],
    meta: PagedMetadata,
) -> torch.Tensor:
    """The decoder layers over embeddings x [T, hidden]; returns the last layer's output."""
    from kernels import fused_ops, layer_ops

    layers = cast(DecoderLayers, module_list)
    residual = x
    normed = fused_ops.rms_norm(x, layers[0].input_layernorm.weight, layers[0].input_layernorm.eps)
    cos, sin = rotary
    for index, (layer, k_pool, v_pool) in enumerate(zip(layers, *kv_pools, strict=True)):
        attn = layer.self_attn
        qkv = invariant.linear(normed, attn.qkv_weight)
        q = layer_ops.rope_and_store(
            qkv, cos, sin, meta.write_slots, k_pool, v_pool, attn.num_heads
        )
        out = cuda_attention(q, k_pool, v_pool, meta)
        attn_out = attn.o_proj(out.view(out.shape[0], -1))
        post = layer.post_attention_layernorm
        normed, residual = layer_ops.add_rms_norm(attn_out, residual, post.weight, post.eps)
        mlp = layer.mlp
        gate_up = invariant.linear(normed, mlp.gate_up_weight)
        mlp_out = mlp.down_proj(layer_ops.silu_mul_halves(gate_up))
        if index + 1 == len(layers):
            return residual + mlp_out
        norm = layers[index + 1].input_layernorm
        normed, residual = layer_ops.add_rms_norm(mlp_out, residual, norm.weight, norm.eps)
    raise AssertionError("a model has at least one layer")
