"""HF transformers as the GPU benchmark's peers (eager; static cache + a CUDA-graph decode
step), and the target's top-two logit gap where two greedy outputs part."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def _hf(gguf: Path, dtype: torch.dtype = torch.bfloat16):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    # transformers' wrapper of Module.to types its first argument as a model, not a device
    return model.to("cuda").eval()  # type: ignore[arg-type]


def _cuda_ids(ids: list[int]) -> torch.Tensor:
    return torch.tensor([ids], device="cuda")


def hf_eager_tok_s(gguf: Path, prompts: list[list[int]], max_new: int) -> dict:
    model = _hf(gguf)
    tokens, wall = 0, 0.0
    with torch.inference_mode():
        model.generate(_cuda_ids(prompts[0]), max_new_tokens=8, do_sample=False)
        for prompt in prompts:
            ids = _cuda_ids(prompt)
            began = time.perf_counter()
            out = model.generate(
                ids, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False
            )
            torch.cuda.synchronize()
            wall += time.perf_counter() - began
            tokens += out.shape[1] - ids.shape[1]
    return {"batch": 1, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}


def hf_graph_tok_s(gguf: Path, prompts: list[list[int]], max_new: int) -> dict:
    """Greedy decoding with HF's StaticCache and one captured CUDA graph per decode step,
    replayed token by token with one host read per token (as a serving loop would)."""
    from transformers import StaticCache

    model = _hf(gguf)
    tokens, wall = 0, 0.0
    for prompt in prompts:
        ids = _cuda_ids(prompt)
        cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + max_new + 8)
        with torch.inference_mode():
            began = time.perf_counter()
            n = _graph_decode(model, cache, ids, max_new)
            wall += time.perf_counter() - began
        tokens += n
    return {"batch": 1, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}


def _graph_decode(model, cache, ids: torch.Tensor, max_new: int) -> int:
    length = ids.shape[1]
    out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                cache_position=torch.arange(length, device="cuda"))  # fmt: skip
    token = out.logits[:, -1:].argmax(-1)
    static_ids = token.clone()
    static_pos = torch.tensor([length], device="cuda")

    def step() -> torch.Tensor:
        logits = model(input_ids=static_ids, past_key_values=cache, use_cache=True,
                       cache_position=static_pos).logits  # fmt: skip
        return logits[:, -1:].argmax(-1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up writes position `length`; the first replay rewrites it
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_next = step()
    produced = 1
    for i in range(max_new - 1):
        static_pos.fill_(length + i)
        graph.replay()
        static_ids.copy_(static_next)
        static_next[0, 0].item()  # the host reads every token
        produced += 1
    return produced


def top2_gap(gguf: Path, dtype: str, prompt: list[int], prefix: list[int]) -> float:
    """Our target's top-1 minus top-2 logit after ``prompt`` + ``prefix`` (one eager pass)."""
    from model_runtime.attention import build_metadata
    from model_runtime.loading import load_model
    from model_runtime.pools import SlotPools
    from plumbing.paths import default_cache_dir

    ids = prompt + prefix
    model = load_model(gguf, getattr(torch, dtype), torch.device("cuda"), default_cache_dir())
    pools = SlotPools(model.config, len(ids) + 1, getattr(torch, dtype), torch.device("cuda"))
    n = len(ids)
    slots = torch.arange(n, device="cuda")
    meta = build_metadata(
        slots, slots[None, :], torch.zeros(1, dtype=torch.long, device="cuda"),
        torch.tensor([n], device="cuda"), n,
    )  # fmt: skip
    with torch.inference_mode():
        hidden = model(torch.tensor(ids, device="cuda"), slots, (pools.k, pools.v), meta)
        top = model.logits(hidden[-1:]).topk(2).values[0]
    return float(top[0] - top[1])
