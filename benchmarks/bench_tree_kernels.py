"""Triton tree kernels against their torch reference on CUDA: time per call, eager and in a graph.

For each model shape (the default SmolLM2-135M and a Llama-3.1-8B shape, bf16 pools), batch size
and tree size, it times the three tree ops of a verify step: tree mask + positions, greedy
acceptance and compaction of the accepted path over every K, V and hidden pool. "eager" is one
launch sequence per call (what a step without graphs pays, launch overhead included); "graph" is
the per-call time of 20 calls captured in one CUDA graph and replayed (device time plus graph
launch). Trees are EAGLE-shaped (topk 4, depth 6); the target accepts a full-depth chain, so
compaction moves 6 rows per tree and pool. Needs only torch and triton:

    python -m benchmarks.bench_tree_kernels          # prints a table, saves JSON
    python -m benchmarks.bench_tree_kernels --quick  # one shape, fewer repeats
"""

from __future__ import annotations

import argparse
import json
import platform
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import triton

from kernels import tree_kernels, tree_reference

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {  # layers, KV heads, head dim, hidden size
    "smollm2-135m": (30, 3, 64, 576),
    "llama-3.1-8b-shape": (32, 8, 128, 4096),
}
CALLS_PER_GRAPH = 20


@dataclass
class Row:
    model: str
    batch: int
    nodes: int
    op: str
    impl: str
    eager_us: float
    graph_us: float


def eagle_tree(
    rng: random.Random, num_nodes: int, topk: int = 4, depth: int = 6
) -> tuple[list[int], int]:
    """Parents of a tree grown level by level (children of up to ``topk`` nodes per level, 1 to
    ``topk`` each), padded with parent-0 nodes to ``num_nodes``; and its real node count."""
    parents, level = [-1], [0]
    for _ in range(depth):
        grown = []
        for parent in level[:topk]:
            for _ in range(rng.randint(1, topk)):
                if len(parents) < num_nodes:
                    parents.append(parent)
                    grown.append(len(parents) - 1)
        level = grown or level
    return parents + [0] * (num_nodes - len(parents)), len(parents)


def make_batch(batch: int, num_nodes: int, device: torch.device) -> dict[str, torch.Tensor]:
    rng = random.Random(batch * 1000 + num_nodes)
    trees = [eagle_tree(rng, num_nodes) for _ in range(batch)]
    parents = torch.tensor([row for row, _ in trees], device=device)
    real = torch.tensor([count for _, count in trees], device=device)
    valid = torch.arange(num_nodes, device=device)[None, :] < real[:, None]
    tokens = torch.randint(0, 32000, (batch, num_nodes), device=device)
    target_next = torch.randint(0, 32000, (batch, num_nodes), device=device)
    for b, (row, count) in enumerate(trees):  # the target follows the deepest chain
        node = max(range(count), key=lambda n: _depth(row, n))
        while node > 0:
            target_next[b, row[node]] = tokens[b, node]
            node = row[node]
    return {"tokens": tokens, "parents": parents, "valid": valid, "target_next": target_next,
            "start_pos": torch.randint(0, 1024, (batch,), device=device)}


def _depth(parents: list[int], node: int) -> int:
    depth = 0
    while node > 0:
        node, depth = parents[node], depth + 1
    return depth


def make_pools(model: str, num_slots: int, device: torch.device) -> list[torch.Tensor]:
    layers, kv_heads, head_dim, hidden = MODELS[model]
    kv = [torch.randn(num_slots + 1, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
          for _ in range(2 * layers)]
    return [*kv, torch.randn(num_slots + 1, hidden, device=device, dtype=torch.bfloat16)]


def time_eager(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def time_graph(fn: Callable[[], object], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    return time_eager(graph.replay, max(1, repeats // CALLS_PER_GRAPH)) / CALLS_PER_GRAPH


def ops(impl, batch: dict[str, torch.Tensor], pools: list[torch.Tensor], slots: torch.Tensor,
        path: torch.Tensor, dummy: int) -> dict[str, Callable[[], object]]:
    t = batch
    return {
        "tree_mask_and_positions": lambda: impl.tree_mask_and_positions(
            t["parents"], t["valid"], t["start_pos"]),
        "greedy_accept_path": lambda: impl.greedy_accept_path(
            t["tokens"], t["parents"], t["valid"], t["target_next"]),
        "compact_accepted": lambda: impl.compact_accepted(pools, slots, path, dummy),
    }


def run(shapes: list[tuple[str, int, int]], repeats: int) -> list[Row]:
    device = torch.device("cuda")
    rows = []
    for model, batch_size, num_nodes in shapes:
        batch = make_batch(batch_size, num_nodes, device)
        num_slots = max(4096, batch_size * num_nodes)
        pools = make_pools(model, num_slots, device)
        slots = torch.randperm(num_slots, device=device)[: batch_size * num_nodes].view(
            batch_size, num_nodes)
        path = tree_reference.greedy_accept_path(
            batch["tokens"], batch["parents"], batch["valid"], batch["target_next"]).path
        for impl_name, impl in (("triton", tree_kernels), ("torch", tree_reference)):
            for op, fn in ops(impl, batch, pools, slots, path, num_slots).items():
                row = Row(model, batch_size, num_nodes, op, impl_name,
                          time_eager(fn, repeats), time_graph(fn, repeats))
                print(f"{model:20s} B={batch_size:<3d} N={num_nodes:<3d} {op:24s} "
                      f"{impl_name:6s} eager {row.eager_us:8.1f} us  graph {row.graph_us:8.1f} us",
                      flush=True)
                rows.append(row)
        del pools
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Triton tree kernels vs torch reference, CUDA")
    parser.add_argument("--quick", action="store_true", help="one shape, fewer repeats")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or tree_kernels.INTERPRETED:
        raise SystemExit("needs a CUDA device and compiled Triton (TRITON_INTERPRET unset)")
    shapes = [(m, b, n) for m in MODELS for b in (1, 8, 32) for n in (16, 64)]
    if args.quick:
        shapes = [("smollm2-135m", 8, 16)]
    rows = run(shapes, repeats=40 if args.quick else 200)
    name = torch.cuda.get_device_name().replace(" ", "-").lower()
    out = args.out or RESULTS / f"tree_kernels_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__,
                     "python": platform.python_version()},
        "calls_per_graph": CALLS_PER_GRAPH,
        "rows": [asdict(r) for r in rows],
        "speedup": speedups(rows),
    }
    out.write_text(json.dumps(report, indent=1))
    print(f"saved {out}")


def speedups(rows: list[Row]) -> list[dict[str, object]]:
    """torch time / triton time for each (model, batch, nodes, op), eager and in a graph."""
    by_key = {(r.model, r.batch, r.nodes, r.op, r.impl): r for r in rows}
    found = []
    for (model, batch, nodes, op, impl), tri in by_key.items():
        if impl == "triton":
            ref = by_key[(model, batch, nodes, op, "torch")]
            found.append({"model": model, "batch": batch, "nodes": nodes, "op": op,
                          "eager": round(ref.eager_us / tri.eager_us, 2),
                          "graph": round(ref.graph_us / tri.graph_us, 2)})
    return found


if __name__ == "__main__":
    main()
