"""A Llama-family decoder that reads and writes a slot-indexed KV pool.

Parameter names follow transformers' LlamaForCausalLM, so its state dict loads as is.
"""

from __future__ import annotations

import torch
from torch import nn

from model_runtime import fused, fused_layers
from model_runtime.attention import AttentionMetadata, slot_attention
from model_runtime.config import ModelConfig
from model_runtime.layers import GatedMLP, RMSNorm, RotaryTable, apply_rotary
from model_runtime.packed_linear import Linear
from model_runtime.paged import PagedMetadata


class SelfAttention(nn.Module):
    qkv_weight: torch.Tensor  # q|k|v in one weight: set by fused_layers.merge_projections

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = Linear(hidden, config.num_heads * config.head_dim, bias=False)
        self.k_proj = Linear(hidden, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = Linear(hidden, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = Linear(config.num_heads * config.head_dim, hidden, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata | PagedMetadata,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = slot_attention(q, k, v, kv[0], kv[1], meta)
        return self.o_proj(out.reshape(num_tokens, -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        kv: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata | PagedMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, kv, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


def token_embedding(vocab_size: int, hidden_size: int) -> nn.Embedding:
    """nn.Embedding, without its random init where it is made on the meta device (loading.py
    `model_with_weights`: the checkpoint's weight replaces it): normal_ on a meta tensor
    imports torch._dynamo, 1.4-2.2 s of every model service's start on 2 cores (2026-12-07)."""
    if torch.get_default_device().type == "meta":
        weight = torch.empty(vocab_size, hidden_size)
        return nn.Embedding(vocab_size, hidden_size, _weight=weight)
    return nn.Embedding(vocab_size, hidden_size)


class LlamaBody(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = token_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """forward() runs the decoder over a step's tokens; logits() projects chosen rows."""

    def __init__(self, config: ModelConfig, rotary: RotaryTable | None = None) -> None:
        """``rotary``: the cos/sin tables, if made already (made here otherwise)."""
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        if rotary is None:
            rotary = RotaryTable(config.head_dim, config.max_position, config.rope_theta)
        self.rotary = rotary

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_pools: tuple[list[torch.Tensor], list[torch.Tensor]],
        meta: AttentionMetadata | PagedMetadata,
    ) -> torch.Tensor:
        """Returns the last layer's output before the final norm, [T, hidden]."""
        x = self.model.embed_tokens(input_ids)
        rotary = self.rotary(positions, x.dtype)
        if isinstance(meta, PagedMetadata) and fused_layers.is_merged(self):
            return fused_layers.fused_body(self.model.layers, x, rotary, kv_pools, meta)
        k_pools, v_pools = kv_pools
        for layer, k_pool, v_pool in zip(self.model.layers, k_pools, v_pools, strict=True):
            x = layer(x, rotary, (k_pool, v_pool), meta)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for rows of forward()'s output."""
        return self.lm_head(self.model.norm(hidden)).float()

    def greedy_ids(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """argmax of logits(hidden), without their fp32 copy (the cast keeps the order)."""
        return fused.argmax(self.lm_head(self.model.norm(hidden)), out)
