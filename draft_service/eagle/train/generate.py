"""Batched greedy decoding with the target's own layers, for self-distillation.

Only the tokens matter here (features are recomputed afterwards by the target's forward), so
decoding uses a contiguous left-padded KV cache and grouped attention instead of the slot pool:
on a GPU one decode step is one CUDA graph replay, with no host sync until the batch ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import torch

from model_runtime.layers import apply_rotary
from model_runtime.llama import DecoderLayer, LlamaForCausalLM

_DONE_CHECK_EVERY = 32  # decode steps between host checks for "every row finished"


def _qkv(layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, S, H] -> q [B, S, Hq, D], k and v [B, Hkv, S, D] (rotated)."""
    attn = layer.self_attn
    num_batch, num_new, _ = x.shape
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(num_batch, num_new, attn.num_heads, attn.head_dim)
    k = attn.k_proj(h).view(num_batch, num_new, attn.num_kv_heads, attn.head_dim)
    v = attn.v_proj(h).view(num_batch, num_new, attn.num_kv_heads, attn.head_dim)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    return q, k.transpose(1, 2), v.transpose(1, 2)


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      allowed: torch.Tensor) -> torch.Tensor:
    """q [B, S, Hq, D]; keys/values [B, Hkv, L, D]; allowed [B, S, L] -> [B, S, Hq * D].

    Query head h reads KV head h // (Hq / Hkv), as transformers' repeat_kv does, without
    materialising the repeated keys. Softmax in fp32.
    """
    num_batch, num_new, num_heads, head_dim = q.shape
    num_kv, num_keys = keys.shape[1], keys.shape[2]
    group = num_heads // num_kv
    qg = q.view(num_batch, num_new, num_kv, group, head_dim).permute(0, 2, 3, 1, 4)
    scores = qg.reshape(num_batch, num_kv, group * num_new, head_dim) @ keys.transpose(-1, -2)
    scores = scores.float().view(num_batch, num_kv, group, num_new, num_keys) / math.sqrt(head_dim)
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    out = probs.view(num_batch, num_kv, group * num_new, num_keys) @ values
    out = out.view(num_batch, num_kv, group, num_new, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(num_batch, num_new, num_heads * head_dim)


class _Batch:
    """Device state of one decoding batch; every tensor keeps its address (graph replay)."""

    def __init__(self, model: LlamaForCausalLM, prompts: Sequence[Sequence[int]],
                 max_new_tokens: int, pad_id: int) -> None:
        config, param = model.config, model.lm_head.weight
        device, dtype = param.device, param.dtype
        self.prompt_len = max(len(p) for p in prompts)
        self.width = self.prompt_len + max_new_tokens
        num_batch = len(prompts)
        cache_shape = (num_batch, config.num_kv_heads, self.width, config.head_dim)
        self.k = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in model.model.layers]
        self.v = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in model.model.layers]
        pads = [self.prompt_len - len(p) for p in prompts]
        self.pad = torch.tensor(pads, device=device)
        ids = [[pad_id] * n + list(p) for n, p in zip(pads, prompts, strict=True)]
        self.prompt_ids = torch.tensor(ids, device=device)
        self.token = torch.zeros(num_batch, dtype=torch.long, device=device)
        self.column = torch.tensor(self.prompt_len, device=device)  # cache column of `token`
        self.out = torch.full((num_batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
        self.done = torch.zeros(num_batch, dtype=torch.bool, device=device)
        self.key_index = torch.arange(self.width, device=device)


class GreedyGenerator:
    """Greedy continuations of many prompts; stops a row at ``eos_id`` (kept in the output)."""

    def __init__(self, model: LlamaForCausalLM, eos_id: int | None, use_cuda_graph: bool = True
                 ) -> None:
        self.model = model.eval()
        self.eos_id = eos_id
        device = model.lm_head.weight.device
        self.use_cuda_graph = use_cuda_graph and device.type == "cuda"

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """One batch: all prompts together, left-padded."""
        pad_id = self.eos_id if self.eos_id is not None else 0
        state = _Batch(self.model, prompts, max_new_tokens, pad_id)
        self._prefill(state)
        step = self._graph_step(state) if self.use_cuda_graph else (lambda: self._decode(state))
        for i in range(1, max_new_tokens):
            step()
            if i % _DONE_CHECK_EVERY == 0 and bool(state.done.all()):
                break
        return [self._cut(row) for row in state.out.tolist()]

    def _cut(self, row: list[int]) -> list[int]:
        if self.eos_id is not None and self.eos_id in row:
            return row[: row.index(self.eos_id) + 1]
        return row

    def _rotary(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.model.rotary(positions.flatten(), dtype)
        shape = (*positions.shape, 1, cos.shape[-1])
        return cos.view(shape), sin.view(shape)

    def _layers(self, state: _Batch, x: torch.Tensor, positions: torch.Tensor,
                allowed: torch.Tensor, columns: slice | torch.Tensor) -> torch.Tensor:
        cos, sin = self._rotary(positions, x.dtype)
        layers = cast(list[DecoderLayer], list(self.model.model.layers))
        for layer, k_cache, v_cache in zip(layers, state.k, state.v, strict=True):
            q, k, v = _qkv(layer, x, cos, sin)
            if isinstance(columns, slice):
                k_cache[:, :, columns], v_cache[:, :, columns] = k, v
                keys, values = k_cache[:, :, columns], v_cache[:, :, columns]
            else:
                k_cache.index_copy_(2, columns, k)
                v_cache.index_copy_(2, columns, v)
                keys, values = k_cache, v_cache
            x = x + layer.self_attn.o_proj(grouped_attention(q, keys, values, allowed))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def _prefill(self, state: _Batch) -> None:
        n = state.prompt_len
        index = torch.arange(n, device=state.pad.device)
        positions = (index[None, :] - state.pad[:, None]).clamp(min=0)
        causal = index[None, :] <= index[:, None]  # [query, key]
        allowed = causal[None] & (index[None, None, :] >= state.pad[:, None, None])
        allowed |= torch.eye(n, dtype=torch.bool, device=index.device)  # pad rows see themselves
        x = self.model.model.embed_tokens(state.prompt_ids)
        x = self._layers(state, x, positions, allowed, slice(0, n))
        self._emit(state, x[:, -1], torch.zeros((), dtype=torch.long, device=x.device))

    def _decode(self, state: _Batch) -> None:
        """One token per row at cache column ``state.column``; advances the column."""
        column = state.column.view(1)
        positions = (state.column - state.pad)[:, None]
        allowed = (state.key_index >= state.pad[:, None]) & (state.key_index <= state.column)
        x = self.model.model.embed_tokens(state.token)[:, None]
        x = self._layers(state, x, positions, allowed[:, None], column)
        self._emit(state, x[:, 0], state.column - state.prompt_len + 1)
        state.column.add_(1)

    def _emit(self, state: _Batch, hidden: torch.Tensor, out_index: torch.Tensor) -> None:
        token = self.model.logits(hidden).argmax(-1)
        if self.eos_id is not None:
            token = torch.where(state.done, self.eos_id, token)
            state.done |= token == self.eos_id
        state.out.index_copy_(1, out_index.view(1), token[:, None])
        state.token.copy_(token)

    def _graph_step(self, state: _Batch):  # type: ignore[no-untyped-def]
        """Runs the first decode step eagerly on a side stream, then captures the step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._decode(state)  # a real step: warms up kernels before the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._decode(state)  # captured only: nothing runs until replay
        first = [True]

        def step() -> None:
            if first[0]:  # the warm-up already produced this step's token
                first[0] = False
                return
            graph.replay()

        return step


def generate_all(generator: GreedyGenerator, prompts: Sequence[Sequence[int]],
                 max_new_tokens: int, max_batch_tokens: int,
                 progress: bool = True) -> list[list[int]]:
    """Continuations of every prompt, batched by length so left padding stays small."""
    from tqdm import tqdm

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    results: list[list[int]] = [[] for _ in prompts]
    batches: list[list[int]] = []
    for i in order:
        width = len(prompts[i]) + max_new_tokens
        if batches and (len(batches[-1]) + 1) * width <= max_batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    bar = tqdm(total=len(prompts), desc="generate", unit="prompt", disable=not progress)
    for batch in batches:
        for i, reply in zip(batch, generator.generate([prompts[i] for i in batch], max_new_tokens),
                            strict=True):
            results[i] = reply
        bar.update(len(batch))
    bar.close()
    return results
