"""The head run as it drafts, for training: step 1 over every pair of a sequence, then steps
2..J fed the head's own predicted features ("training-time test", EAGLE-3).

Indexing: anchor a is the context's last real pair (x_{a+1}, h_a) at position a. Step j at
anchor a reads (x_{a+j}, f_{j-1,a}) at position a + j - 1, where f_{0,a} = h_a, and predicts
f_{j,a} ~ h_{a+j}, whose logits give x_{a+j+1}. Its query sees what the drafter's tree search
lets it see: the step-1 keys of positions <= a (context) and the keys of steps 2..j at the
same anchor (its ancestors and itself).
"""

from __future__ import annotations

from functools import lru_cache
from typing import cast

import torch
import torch.nn.functional as F

from draft_service.eagle.head import EagleHead
from model_runtime.layers import apply_rotary
from model_runtime.llama import DecoderLayer


@lru_cache(maxsize=64)
def step_mask(num_anchors: int, step: int, device: torch.device) -> torch.Tensor:
    """[M, step * M] bool: causal over step-1 keys, then one diagonal block per later step."""
    causal = torch.ones(num_anchors, num_anchors, dtype=torch.bool, device=device).tril()
    eye = torch.eye(num_anchors, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (step - 1), dim=1)


def _attend(layer: DecoderLayer, x: torch.Tensor, positions: torch.Tensor, head: EagleHead,
            keys: list[torch.Tensor], values: list[torch.Tensor], step: int) -> torch.Tensor:
    """One decoder layer on [B, M, H]; appends this step's K/V to ``keys``/``values``."""
    attn = layer.self_attn
    num_batch, num_anchors, _ = x.shape
    h = layer.input_layernorm(x)
    cos, sin = head.rotary(positions, x.dtype)  # [M, 1, D]: broadcasts over the batch
    q = apply_rotary(attn.q_proj(h).view(num_batch, num_anchors, attn.num_heads, -1), cos, sin)
    k = apply_rotary(attn.k_proj(h).view(num_batch, num_anchors, attn.num_kv_heads, -1), cos, sin)
    v = attn.v_proj(h).view(num_batch, num_anchors, attn.num_kv_heads, -1)
    keys.append(k)
    values.append(v)
    group = attn.num_heads // attn.num_kv_heads
    # Keys repeated per query head: the memory-efficient kernel takes a mask but no GQA.
    k_all = torch.cat(keys, 1).transpose(1, 2).repeat_interleave(group, dim=1)
    v_all = torch.cat(values, 1).transpose(1, 2).repeat_interleave(group, dim=1)
    mask = step_mask(num_anchors, step, x.device)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k_all.to(q.dtype), v_all.to(q.dtype),
                                         attn_mask=mask)
    out = out.transpose(1, 2).reshape(num_batch, num_anchors, -1)
    x = x + attn.o_proj(out)
    return x + layer.mlp(layer.post_attention_layernorm(x))


def unrolled_features(head: EagleHead, tokens: torch.Tensor, features: torch.Tensor,
                      num_steps: int, detach_between_steps: bool = False) -> list[torch.Tensor]:
    """tokens [B, N + num_steps] (padded on the right), features [B, N, H] (h_0..h_{N-1}).

    Returns num_steps tensors [B, N, H]: out[j - 1][:, a] = f_{j,a} (rows past a sequence's end
    are garbage, to be masked by the loss).
    """
    num_anchors = features.shape[1]
    keys: list[list[torch.Tensor]] = [[] for _ in head.layers]
    values: list[list[torch.Tensor]] = [[] for _ in head.layers]
    anchor = torch.arange(num_anchors, device=features.device)
    feature_in = features
    outs = []
    for step in range(1, num_steps + 1):
        token_in = tokens[:, step : step + num_anchors]
        embedded = head.embed_tokens(token_in)
        x = head.fc(torch.cat([embedded, feature_in.to(head.fc.weight.dtype)], -1))
        for i, layer in enumerate(cast(list[DecoderLayer], list(head.layers))):
            x = _attend(layer, x, anchor + step - 1, head, keys[i], values[i], step)
        outs.append(x)
        feature_in = x.detach() if detach_between_steps else x
    return outs
