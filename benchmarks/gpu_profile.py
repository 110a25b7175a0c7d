"""Where a GPU decode step goes: the kernels of one step (torch.profiler) and graph replay's
device time against the engine's wall time per step (host work included).

  python -m benchmarks.gpu_profile --shape llama-8b --context 1024 [--attention paged --merged]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu_steps import GREEDY, SHAPES, _cuda_ms, _engine, random_model
from model_runtime.fused import use_fused_kernels
from model_runtime.fused_layers import merge_projections
from target_service.engine import StepItem, VerifyItem
from target_service.graph_runner import GREEDY as GREEDY_GRAPH


def top_kernels(fn, count: int = 25) -> list[dict]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: -e.device_time_total)
    return [
        {"kernel": e.key[:90], "calls": e.count, "total_us": round(e.device_time_total, 1)}
        for e in events[:count]
    ]


def host_ops(fn, count: int = 20) -> list[dict]:
    """The torch calls of one engine step by host time (what a decode step costs off the GPU)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return [
        {"op": e.key[:60], "calls": e.count, "self_us": round(e.self_cpu_time_total, 1)}
        for e in events[:count]
    ]


def profile_shape(shape: str, context: int, attention: str, merged: bool) -> dict:
    model = random_model(shape, torch.bfloat16)
    use_fused_kernels(True)
    if merged:
        merge_projections(model)
    engine = _engine(model, True, (1,), attention)
    slot = iter(range(40000))
    prompt = [(7 * j) % 1000 + 1 for j in range(context)]
    with torch.inference_mode():
        engine.forward([StepItem("r", prompt, 0, [next(slot) for _ in prompt], True, GREEDY)])
    length = context

    def step() -> float:
        nonlocal length
        result = engine.forward([StepItem("r", [5], length, [next(slot)])])
        length += 1
        return result.forward_ms

    walls = [step() for _ in range(20)]
    runner = engine.graphs
    assert runner is not None
    graph = next(iter(runner.graphs.values()))
    replay = [_cuda_ms(graph.replay) for _ in range(20)]
    with torch.inference_mode():
        eager = top_kernels(lambda: runner._body(1, runner.context_buckets[0], GREEDY_GRAPH))
        graphed = top_kernels(graph.replay)
    host = host_ops(step)
    verify = _verify_profile(engine, slot, length)
    return {
        "shape": shape, "attention": attention, "merged": merged, "chunk": _chunk(),
        "tile_rows": _tile_rows(),
        "engine_step_ms": statistics.median(walls[3:]),
        "graph_replay_ms": statistics.median(replay[3:]),
        "eager_kernels": eager, "replay_kernels": graphed, "host_ops": host, **verify,
    }  # fmt: skip


def _verify_profile(engine, slot, length: int) -> dict:
    """The 16-node chain verify graph's replay time and kernels, beside the decode step's."""
    runner = engine.verify_graphs
    if runner is None:
        return {}
    item = VerifyItem("r", length, [5] * 16, [-1, *range(15)], [next(slot) for _ in range(16)])
    engine.verify([item])  # reserves the tree's slots and loads the graph's buffers
    graph = runner.graphs[(1, 16, False)]
    replay = [_cuda_ms(graph.replay) for _ in range(20)]
    return {
        "verify16_replay_ms": statistics.median(replay[3:]),
        "verify16_replay_kernels": top_kernels(graph.replay, 40),
    }


def _tile_rows() -> int:
    from kernels import paged_attention

    return paged_attention.TILE_ROWS


def _chunk() -> int:
    from kernels import paged_attention

    return paged_attention.CHUNK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--attention", default="paged")
    parser.add_argument("--merged", action="store_true")
    parser.add_argument("--chunk", type=int, help="paged attention's keys per split (experiment)")
    parser.add_argument("--tile-rows", type=int, help="paged attention's rows a program")
    args = parser.parse_args()
    if args.tile_rows:
        from kernels import paged_attention

        paged_attention.TILE_ROWS = args.tile_rows  # read at each call (experiment)
    if args.chunk:
        from kernels import paged_attention

        paged_attention.CHUNK = args.chunk  # read at each call; captured graphs take it too
    report = profile_shape(args.shape, args.context, args.attention, args.merged)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
