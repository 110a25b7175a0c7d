"""The paged backend's two CUDA kernels side by side: Triton (kernels/paged_attention.py, the
default) and FlashInfer's batch decode (model_runtime/flashinfer_attention.py).

One layer's attention of the Llama-3.1-8B shape (32 heads, 8 KV heads, head dim 128, bf16) over
a slot pool, for decode batches of 1, 8 and 32 and for one 16-node chain verify, at a 1,024-token
context. Each figure is the mean of 20 calls replayed from one CUDA graph (the way a decode step
runs them), after the plan where FlashInfer needs one. Also checks that the two agree.
`python -m benchmarks.gpu_attention --out benchmarks/results/gpu_attention.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from model_runtime import flashinfer_attention, paged
from model_runtime.cuda_graphs import capture_graph

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CALLS = 20


def _graph_us(fn) -> dict:
    """Mean microseconds of fn() over CALLS calls captured in one graph (warmed up first, as the
    graph runners capture), or over as many eager calls where the capture fails (then "eager"
    says so)."""

    def calls() -> None:
        for _ in range(CALLS):
            fn()

    try:
        run, how = capture_graph(torch.device("cuda"), None, calls).replay, "graph"
    except RuntimeError:
        torch.cuda.synchronize()
        run, how = calls, "eager"
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        run()
    end.record()
    end.synchronize()
    return {"us": start.elapsed_time(end) * 1e3 / (5 * CALLS), "timed": how}


def case(batch: int, context: int, tree_nodes: int, gen: torch.Generator) -> dict:
    """``batch`` requests of ``context`` committed keys; each query is a decode token
    (tree_nodes 0) or the nodes of a chain of ``tree_nodes``."""
    num_slots = batch * (context + max(tree_nodes, 1)) + 1
    k_pool, v_pool = (
        torch.randn((num_slots, KV_HEADS, HEAD_DIM), generator=gen).to("cuda", torch.bfloat16)
        for _ in range(2)
    )
    width = context + max(tree_nodes, 1)
    table = torch.randperm(num_slots - 1, generator=gen)[: batch * width].view(batch, width)
    table, rows = table.cuda(), torch.arange(batch, device="cuda")
    if tree_nodes:
        chain = torch.arange(tree_nodes, device="cuda")
        ancestors = (chain[None, :] <= chain[:, None]).expand(batch, -1, -1)
        start = torch.full((batch,), context, device="cuda")
        node_slots = table[:, context:]
        meta = paged.for_trees(table, rows, start, node_slots, ancestors.contiguous(),
                               chain.expand(batch, -1).contiguous(), None)  # fmt: skip
    else:
        positions = torch.full((batch,), context, device="cuda")
        meta = paged.for_sequences(table, rows, positions, table[:, context], num_slots - 1,
                                   max_keys=context + 1)  # fmt: skip
    q = torch.randn((meta.query_len.numel(), HEADS, HEAD_DIM), generator=gen)
    q = q.to("cuda", torch.bfloat16)
    triton_out = paged.triton_attention(q, k_pool, v_pool, meta)
    flash_out = flashinfer_attention.attention(q, k_pool, v_pool, meta)  # plans, once
    diff = (triton_out.float() - flash_out.float()).abs().max().item()
    return {
        "batch": batch, "context": context, "tree_nodes": tree_nodes,
        "triton": _graph_us(lambda: paged.triton_attention(q, k_pool, v_pool, meta)),
        "flashinfer": _graph_us(lambda: flashinfer_attention.attention(q, k_pool, v_pool, meta)),
        "max_abs_diff": diff,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch, nodes in [(1, 0), (8, 0), (32, 0), (1, 16), (8, 16)]:
        try:
            rows.append(case(batch, args.context, nodes, gen))
        except Exception as err:  # one failing case must not lose the others' figures
            error = f"{type(err).__name__}: {err}"
            rows.append({"batch": batch, "tree_nodes": nodes, "error": error})
        print(json.dumps(rows[-1]), flush=True)
    report = {"device": torch.cuda.get_device_name(), "shape": "llama-8b attention, bf16",
              "calls_per_graph": CALLS, "rows": rows}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
