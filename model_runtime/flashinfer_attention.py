"""FlashInfer's paged decode kernel as the CUDA kernel of the paged attention backend.

`--attention flashinfer` keeps the paged backend's metadata (model_runtime/paged.py: each
query token names its own keys, table columns below ``prefix_len`` then its ``path``) and hands
the step to FlashInfer instead of the Triton kernel. The slot pools are FlashInfer's pages with
one slot a page (NHD layout, [slots, 1, kv heads, head dim] views: no copy), and every query
token is one entry of the batch decode kernel with its own page list, so a decode, a prefill
chunk and a tree node are the same call. The plan (page lists, indptr) is made once a step, on
the first layer's call, and reused by the other layers.

What it is not: batch-invariant (FlashInfer picks its KV split from the batch), capturable here
(its plan reads the step's lengths on the host, so the target runs it without CUDA graphs), or
fp32 (its kernels take fp16/bf16). The Triton kernel stays the default for those reasons;
benchmarks/gpu_attention.py times the two side by side. `pip install '.[gpu]'` brings it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
from torch import Tensor

from model_runtime.paged import PagedMetadata

WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended split-KV scratch


def unavailable_reason(device: str, dtype: str) -> str | None:
    """Why `--attention flashinfer` cannot run with these settings, or None."""
    if not device.startswith("cuda"):
        return "FlashInfer runs on CUDA only"
    if dtype not in ("float16", "bfloat16"):
        return f"FlashInfer's kernels take float16 or bfloat16, not {dtype}"
    if importlib.util.find_spec("flashinfer") is None:
        return "flashinfer is not installed (pip install '.[gpu]')"
    return None


@dataclass
class _Plan:
    meta: PagedMetadata  # held so that its id() is not reused while the plan is cached
    wrapper: object


_workspaces: dict[torch.device, Tensor] = {}
_last: _Plan | None = None


def attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, meta: PagedMetadata) -> Tensor:
    """The paged backend's attention (the step's K/V already in the pools). q: [T, H, D]."""
    plan = _plan_for(meta, q, k_pool)
    pages = (k_pool.unsqueeze(1), v_pool.unsqueeze(1))  # [S, page 1, Hkv, D]
    return plan.wrapper.run(q.contiguous(), pages)  # type: ignore[attr-defined]


def _plan_for(meta: PagedMetadata, q: Tensor, k_pool: Tensor) -> _Plan:
    global _last
    if _last is not None and _last.meta is meta:
        return _last
    import flashinfer

    workspace = _workspaces.get(q.device)
    if workspace is None:
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        _workspaces[q.device] = workspace
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr, indices = token_page_lists(meta)
    wrapper.plan(
        indptr, indices, torch.ones(indptr.numel() - 1, dtype=torch.int32, device=q.device),
        q.shape[1], k_pool.shape[1], q.shape[2], 1,
        q_data_type=q.dtype, kv_data_type=k_pool.dtype,
    )  # fmt: skip
    _last = _Plan(meta, wrapper)
    return _last


def token_page_lists(meta: PagedMetadata) -> tuple[Tensor, Tensor]:
    """Each query token's keys as a page list (pages of one slot): indptr [T + 1] and the
    concatenated slots, int32. Reads the longest key count on the host (one sync a step)."""
    from kernels.paged_reference import logical_slots

    slots = logical_slots(meta.table, meta.query_row, meta.query_len, meta.prefix_len, meta.path)
    indices = slots[slots >= 0].to(torch.int32)  # row-major: token by token
    indptr = torch.zeros(slots.shape[0] + 1, dtype=torch.int32, device=slots.device)
    indptr[1:] = meta.query_len.cumsum(0)
    return indptr, indices
