"""Builds an EagleDrafter from the draft service's configuration."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from draft_service.drafter import ContextChunk, Drafter, TreeShape
from draft_service.eagle.append_graphs import AppendGraphRunner
from draft_service.eagle.drafter import EagleDrafter
from draft_service.eagle.head import load_head, random_head
from draft_service.eagle.search_graphs import SearchGraphRunner
from model_runtime import paged
from model_runtime.fused_layers import merge_layer_projections
from model_runtime.loading import default_model_path, resolve_checkpoint
from model_runtime.packed_linear import prepack_linears

log = logging.getLogger("splitspec.draft")

DEFAULT_DRAFT_SLOTS = 65536  # draft KV rows: one per context token held across requests
# The head this project trained for the default model (see README, "The EAGLE head").
SHIPPED_HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m"


def build_eagle_drafter(
    model_path: Path | None,
    head_dir: Path | None,
    cache_dir: Path,
    shape: TreeShape,
    dtype: str,
    device: str,
    num_slots: int = DEFAULT_DRAFT_SLOTS,
    cuda_graphs: bool = True,
    prepack: bool = True,
    few_row_kernel: bool = True,
    packed_weights: str = "bfloat16",
) -> Drafter:
    """The head's embedding, final norm and LM head come from the target's own checkpoint.

    On a CPU in fp32 the head's linear layers (fc, the layer's projections, the hot-vocabulary
    head) run their 1-16-row steps on prepacked weights, as the target's do (``prepack``,
    ``few_row_kernel``: the target's --no-prepack and --no-few-row-kernel); on the kernel in
    ``packed_weights`` precision (bfloat16: half the bytes a step reads, docs/cpu.md).
    """
    checkpoint = resolve_checkpoint(model_path or default_model_path(), cache_dir)
    torch_dtype = getattr(torch, dtype)
    if head_dir is None and model_path is None and SHIPPED_HEAD.exists():
        head_dir = SHIPPED_HEAD  # the default model gets the head trained for it
    if head_dir is None:
        log.warning("no --eagle-head: random head weights (lossless, but accepts almost nothing)")
        head = random_head(checkpoint, seed=0, dtype=torch_dtype, device=device)
    else:
        head = load_head(head_dir, checkpoint, torch_dtype, device)
    if prepack:
        packed_dtype = getattr(torch, packed_weights)
        packed, packer = prepack_linears(head, cache_dir, few_row_kernel, packed_dtype=packed_dtype)
        if packed:
            log.info("prepacked %.0f MiB of head weights for few-row steps (%s)",
                     packed / 2**20, packer)  # fmt: skip
    drafter = EagleDrafter(head, shape, num_slots)
    if device.startswith("cuda") and cuda_graphs:
        attach_graphs(drafter)
    elif device == "cpu" and torch_dtype == torch.float32:
        # The target's CPU attention kernel (kernels/exact_attention.h): its own head steps
        # read their keys in place too, instead of torch's gather of every context per step.
        drafter.paged_eager = paged.load_cpu_kernel(cache_dir, fallback=True)
    return drafter


def attach_graphs(drafter: EagleDrafter) -> None:
    """The tree search and the round's append of up to 32 requests replay CUDA graphs
    (search_graphs.py, append_graphs.py), over the head's merged projections."""
    from model_runtime.fused import triton_available

    if not triton_available():
        log.warning("triton is not installed: the draft head runs eagerly")
        return
    head, pool, rows, shape = drafter.head, drafter.pool, drafter.rows, drafter.shape
    # The target's GPU layer body: nine launches a layer instead of seventeen, every step.
    merge_layer_projections(head.layers)
    search = SearchGraphRunner(head, pool, rows, shape)
    append = AppendGraphRunner(head, pool, rows, max(8, shape.num_steps + 1))
    search.capture_all()
    append.capture_all()
    drafter.attach_graphs(search, append)
    warm_up_eager_appends(drafter)


# The eager appends' buckets (eager_append.eager_bucket) run once at start-up: cuBLAS plans
# each new matmul shape on the host, and Triton compiles or loads each new specialization of
# its integer arguments on its first launch. On the H200 without a warm-up the first Ingest
# (46 tokens) took 872 ms of the replica's own work; with one of 1, 16 and 23 pairs, 8 ms; with
# these buckets (and the padding) an Ingest of 46-64 tokens took 5.2-6.7 ms (2026-12-03).
WARM_UP_BUCKETS = (16, 32, 64, 128, 256, 512, 1024)


def warm_up_eager_appends(drafter: EagleDrafter) -> None:
    """An eager append of each bucket's size, as a throwaway request ingested and released
    (up to what the model's context and the draft pool hold)."""
    request_id, room = "splitspec-warm-up", drafter.head.config.target.max_position
    for pairs in WARM_UP_BUCKETS:
        if pairs + 1 + drafter.shape.num_steps > room or pairs > drafter.pool.num_free:
            break
        rows = torch.zeros((pairs, drafter.head.hidden_size), dtype=drafter.dtype)
        drafter.append(ContextChunk(request_id, 0, [0] * (pairs + 1), 0, rows))
        drafter.release(request_id)
