"""The paged attention backend: metadata that names each query's keys through the slot table.

The torch backend (model_runtime/attention.py) gathers every request's context into a dense
[B, K] block and masks it; this one hands the Triton kernel (kernels/paged_attention.py) the
engine's slot table itself plus, per query token, how many logical keys it has and where they
come from. Nothing is gathered, no key width is chosen per step, and a token's keys form the
same sequence in a decode, a prefill chunk or a tree verify (a tree node's keys past the
committed context are its ancestors, root first).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from model_runtime import fused

log = logging.getLogger(__name__)


@dataclass
class PagedMetadata:
    write_slots: Tensor  # [T] slot receiving each token's K/V
    table: Tensor  # [R, W] the engine's slot table (row = request, column = position)
    query_row: Tensor  # [T] table row of each token's request
    query_len: Tensor  # [T] logical keys of each token (its position + 1)
    prefix_len: Tensor  # [T] how many of them are read from the table; the rest from path
    path: Tensor  # [T, P] slots of the keys past prefix_len (a tree node's ancestors + itself)
    max_keys: int | None = None  # a host-known bound on query_len: sizes the GPU kernel's grid
    tile_tokens: int | None = None  # runs of tokens sharing a context (a tree's node count)


def for_sequences(
    table: Tensor,
    query_row: Tensor,
    positions: Tensor,
    write_slots: Tensor,
    dummy_slot: int,
    max_keys: int | None = None,
) -> PagedMetadata:
    """Decode and prefill tokens: every key, the token's own included, is in its table row."""
    query_len = positions + 1
    path = torch.full((positions.shape[0], 1), dummy_slot, dtype=torch.long, device=table.device)
    return PagedMetadata(write_slots, table, query_row, query_len, query_len, path, max_keys)


def for_trees(
    table: Tensor,
    rows: Tensor,
    start_pos: Tensor,
    node_slots: Tensor,
    ancestors: Tensor,
    depths: Tensor,
    real: Tensor | None,
) -> PagedMetadata:
    """Tree nodes [B, N] flattened to the real ones (``real``, [B * N] bool), or all of them
    (``real`` None: a fixed-shape step, whose padding nodes write only the dummy slot).

    Node i's keys: the committed context (table columns below start_pos), then the slots of its
    ancestors in index order, which is root-to-leaf order since a parent precedes its children.
    """
    num_req, num_nodes = node_slots.shape
    index = torch.arange(num_nodes, device=node_slots.device)
    # Ancestors first, in index order; every other node after them.
    order = torch.argsort((~ancestors).long() * num_nodes + index, dim=-1)  # [B, N, N]
    path = node_slots[:, None, :].expand(num_req, num_nodes, num_nodes).gather(2, order)
    start = start_pos[:, None].expand(num_req, num_nodes)

    def keep(t: Tensor) -> Tensor:
        # Contiguous: the kernels index these by token, and a flattened expand of one request's
        # row or start is a stride-0 view (it read past its one element on the GPU).
        return t.contiguous() if real is None else t[real]

    return PagedMetadata(
        write_slots=keep(node_slots.flatten()),
        table=table,
        query_row=keep(rows[:, None].expand(num_req, num_nodes).flatten()),
        query_len=keep((start + depths + 1).flatten()),
        prefix_len=keep(start.flatten()),
        path=keep(path.reshape(num_req * num_nodes, num_nodes)),
        tile_tokens=num_nodes if real is None else None,  # flattened to real nodes: unaligned
    )


_cpu_kernels: ModuleType | None = None  # kernels/exact_attention.h, once loaded


def load_cpu_kernel(
    cache_dir: Path, fallback: bool = False, dtype: torch.dtype = torch.float32
) -> bool:
    """Loads (building once if needed) the CPU attention kernel, float32 only; True once loaded.
    Where it cannot serve (another dtype, or no kernel): False when ``fallback`` (the backend
    was only "auto"'s choice, and the torch backend serves instead; logged where the kernel
    is missing), else a clear error. Called by an engine on the paged backend on CPU before its
    first step. Once loaded, the model's float32 RMSNorm and rotary run on the same module's
    row ops too (model_runtime/fused.py)."""
    global _cpu_kernels
    from kernels import few_row_linear

    if dtype != torch.float32:
        if fallback:
            return False
        raise ValueError(f"the paged attention backend on CPU is float32; the model is {dtype}")
    _cpu_kernels = few_row_linear.load(cache_dir)
    if _cpu_kernels is not None:
        fused.use_cpu_row_ops(_cpu_kernels)  # the same module's RMSNorm and rotary
        return True
    reason = few_row_linear.unavailable_reason() or "its build failed (see the log)"
    if fallback:
        log.warning("the paged CPU attention kernel is off (%s): attention runs on torch", reason)
        return False
    raise RuntimeError(f"the paged attention backend on CPU needs the CPU kernels: {reason}")


def paged_attention(
    q: Tensor, k_new: Tensor, v_new: Tensor, k_pool: Tensor, v_pool: Tensor, meta: PagedMetadata
) -> Tensor:
    """Writes this step's K/V into the pool, then attends. q: [T, H, D]; returns [T, H, D].

    On CUDA the Triton kernel (kernels/paged_attention.py), on CPU the C++ one
    (kernels/exact_attention.h): the same function, each exact per token across step kinds.
    """
    if q.is_cuda:
        k_pool.index_copy_(0, meta.write_slots, k_new)
        v_pool.index_copy_(0, meta.write_slots, v_new)
        return cuda_attention(q, k_pool, v_pool, meta)
    assert _cpu_kernels is not None, "load_cpu_kernel() first"
    args = (meta.table, meta.query_row, meta.query_len, meta.prefix_len, meta.path)
    stored = (k_new, v_new, meta.write_slots, k_pool, v_pool)
    return _cpu_kernels.store_and_attend(q.contiguous(), *stored, *args)


CUDA_KERNELS = ("triton", "flashinfer")
_cuda_kernel = "triton"


def use_cuda_kernel(name: str) -> None:
    """The kernel behind the paged backend on CUDA, for the whole process (set once by the
    engine from its config, like the fused kernels): "triton" or "flashinfer"."""
    global _cuda_kernel
    if name not in CUDA_KERNELS:
        raise ValueError(f"unknown paged attention kernel {name!r}; choose one of {CUDA_KERNELS}")
    _cuda_kernel = name


def cuda_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, meta: PagedMetadata) -> Tensor:
    """Attention over pools that hold the step's K/V, by the kernel chosen for the process."""
    if _cuda_kernel == "flashinfer":
        from model_runtime import flashinfer_attention

        return flashinfer_attention.attention(q, k_pool, v_pool, meta)
    return triton_attention(q, k_pool, v_pool, meta)


def triton_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, meta: PagedMetadata) -> Tensor:
    """The Triton kernel (CUDA, or its interpreter in tests) over pools that hold the step's K/V."""
    from kernels import paged_attention as kernel  # triton: imported only where it runs

    return kernel.paged_attention(
        q, k_pool, v_pool, meta.table, meta.query_row, meta.query_len, meta.prefix_len,
        meta.path, max_keys=meta.max_keys, tile_tokens=meta.tile_tokens,
    )  # fmt: skip
