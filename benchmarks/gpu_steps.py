"""In-process step times of the target engine on a GPU: decode (graph replay and eager) and a
16-node verify, for any Llama shape with random weights, against the HBM floor.

Used by bench_gpu.py; runs alone too: `python -m benchmarks.gpu_steps --shape llama-8b`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from model_runtime.config import ModelConfig
from model_runtime.fused import use_fused_kernels
from model_runtime.fused_layers import is_merged, merge_projections
from model_runtime.invariant import use_invariant_matmul
from model_runtime.llama import LlamaForCausalLM
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.graph_runner import DecodeGraphRunner
from target_service.request_table import SamplingSpec
from target_service.verify_graphs import VerifyGraphRunner

GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
# (merged layers, attention backend, graphs): the torch backend as before, the paged kernel,
# then the merged GPU decoder body (model_runtime/fused_layers.py), replayed and eager.
VARIANTS = [
    (False, "torch", True),
    (False, "paged", True),
    (True, "paged", True),
    (True, "paged", False),
    (True, "flashinfer", False),  # FlashInfer's decode kernel: eager only (its plan syncs)
]
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True,
    ),
    "llama-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
}  # fmt: skip


def model_config(shape: str) -> ModelConfig:
    return ModelConfig(
        name=shape, architecture="llama", rms_norm_eps=1e-5, max_position=8192, **SHAPES[shape]
    )


def random_model(shape: str, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(model_config(shape))
    for p in model.parameters():  # small weights keep activations finite through 32 layers
        p.data.normal_(0.0, 0.02)
    return model.to(dtype).eval()


def copy_bandwidth_bytes_s() -> float:
    """Device-to-device copy, bytes read plus written per second (the HBM's usable rate)."""
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = [_cuda_ms(lambda: dst.copy_(src)) for _ in range(10)]
    return 2 * src.numel() / (statistics.median(times[2:]) / 1e3)


def _cuda_ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _engine(
    model: LlamaForCausalLM, graphs: bool, batch_sizes: tuple[int, ...], attention: str = "torch"
) -> TargetEngine:
    config = TargetConfig(
        model_path=Path("."), cache_dir=Path("."), device="cuda",
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        num_slots=40000, max_requests=64, max_context=4096, attention=attention,
    )  # fmt: skip
    engine = TargetEngine(config, model)
    if graphs:
        table = engine.table.slots if engine.paged else None
        runner = DecodeGraphRunner(model, engine.pools, 2048, batch_sizes, table=table)
        runner.capture_all()
        engine.attach_graphs(runner)
        if attention == "paged":  # the verify step's graph too (target_service/verify_graphs.py)
            verify = VerifyGraphRunner(model, engine.pools, engine.table.slots, batch_sizes, (16,))
            verify.capture_all()
            engine.attach_verify_graphs(verify)
    return engine


def step_times(
    model: LlamaForCausalLM,
    context: int,
    batch: int,
    graphs: bool,
    attention: str = "torch",
    steps: int = 30,
) -> dict[str, float]:
    """Median wall ms of a decode step (engine.forward, host work included) and of a 16-node
    chain verify, for ``batch`` requests of ``context`` tokens each, and the device ms of
    their graphs' replays where they replay one."""
    torch.backends.cuda.enable_cudnn_sdp(False)
    engine = _engine(model, graphs, (batch,), attention)
    slot = iter(range(40000))
    prompts = [[(7 * i + j) % 1000 + 1 for j in range(context)] for i in range(batch)]
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            engine.forward([StepItem(f"r{i}", p, 0, [next(slot) for _ in p], True, GREEDY)])
    lengths = [context] * batch
    decode_ms = []
    with replays_timed() as decode_replays:
        for _ in range(steps):
            items = [StepItem(f"r{i}", [5], lengths[i], [next(slot)]) for i in range(batch)]
            decode_ms.append(engine.forward(items).forward_ms)
            lengths = [n + 1 for n in lengths]
    with replays_timed() as verify_replays:
        verify_ms = _verify_times(engine, slot, lengths, batch, steps)
    return {
        "decode_ms": statistics.median(decode_ms[5:]),
        "verify16_ms": statistics.median(verify_ms[5:]),
        **_replay_medians(decode=decode_replays, verify16=verify_replays),
    }


@contextmanager
def replays_timed() -> Iterator[list]:
    """Device time of every CUDA-graph replay inside the block (events around each replay),
    so a step's graph is timed without the host's part of the step."""
    pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    replay = torch.cuda.CUDAGraph.replay

    def timed(graph: torch.cuda.CUDAGraph) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay(graph)
        end.record()
        pairs.append((start, end))

    torch.cuda.CUDAGraph.replay = timed  # type: ignore[method-assign, assignment]
    try:
        yield pairs
    finally:
        torch.cuda.CUDAGraph.replay = replay  # type: ignore[method-assign]
        torch.cuda.synchronize()


def _replay_medians(**replays: list) -> dict[str, float]:
    out = {}
    for name, pairs in replays.items():
        if len(pairs) > 5:  # the step replayed a graph (eager variants have none)
            out[f"{name}_replay_ms"] = statistics.median(s.elapsed_time(e) for s, e in pairs[5:])
    return out


def _verify_times(engine: TargetEngine, slot, lengths: list[int], batch: int, steps: int):
    verify_ms = []
    for step in range(steps):
        # The first verify reserves each tree's slots; the rest re-use them, as the router's
        # reservation ahead does (verify rolls back what it rejects).
        items = [
            VerifyItem(
                f"r{i}", lengths[i], [5] * 16, [-1, *range(15)],
                [next(slot) for _ in range(16)] if step == 0 else [], False,
            )
            for i in range(batch)
        ]  # fmt: skip
        verify_ms.append(engine.verify(items).forward_ms)
    return verify_ms


def variant_name(merged: bool, attention: str, graphs: bool) -> str:
    return f"{attention}{'-merged' if merged else ''}-{'graphs' if graphs else 'eager'}"


def shape_report(
    shape: str, dtype: torch.dtype, context: int, batches: list[int], only: list[str] | None = None
) -> dict:
    """``only``: the variant_name()s to run (default all, and the exact rows)."""
    model = random_model(shape, dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    floor_ms = weight_bytes / copy_bandwidth_bytes_s() * 1e3  # a decode step reads each once
    rows: list[dict[str, Any]] = []
    use_fused_kernels(True)
    for merged, attention, graphs in VARIANTS:
        if only is not None and variant_name(merged, attention, graphs) not in only:
            continue
        if merged and not is_merged(model):
            merge_projections(model)  # views: the unmerged variants above ran first
        for batch in batches:
            variant = {"attention": attention, "merged_layers": merged, "graphs": graphs}
            times: dict[str, Any]
            try:
                times = step_times(model, context, batch, graphs, attention)
            except Exception as err:  # one broken variant must not lose the others' figures
                times = {"error": f"{type(err).__name__}: {err}"}
            rows.append({"batch": batch, **variant, **times})
            print(json.dumps({"shape": shape, **rows[-1]}), flush=True)
    if only is None or "exact" in only:
        rows += exact_rows(model, shape, context, batches)
    del model
    torch.cuda.empty_cache()
    return {
        "shape": shape,
        "dtype": str(dtype),
        "context": context,
        "weight_gib": weight_bytes / 2**30,
        "hbm_floor_ms": floor_ms,
        "steps": rows,
    }


def exact_rows(model: LlamaForCausalLM, shape: str, context: int, batches: list[int]) -> list:
    """The --exact numerics (paged, merged, the invariant matmul for every linear), replayed."""
    rows = []
    use_invariant_matmul(True)
    try:
        for batch in batches:
            times: dict[str, Any]
            try:
                times = step_times(model, context, batch, True, "paged")
            except Exception as err:  # one broken variant must not lose the others' figures
                times = {"error": f"{type(err).__name__}: {err}"}
            rows.append({"batch": batch, "attention": "paged", "merged_layers": True,
                         "graphs": True, "exact": True, **times})  # fmt: skip
            print(json.dumps({"shape": shape, **rows[-1]}), flush=True)
    finally:
        use_invariant_matmul(False)
    return rows


def cudnn_pathology(shape: str = "smollm2-135m", context: int = 80) -> list[dict]:
    """Eager decode step ms with cuDNN's attention on and off, per dtype (the 94 ms question)."""
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        model = random_model(shape, dtype)
        for cudnn in (True, False):
            engine = _engine(model, False, (1,))
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            slot = iter(range(40000))
            prompt = list(range(1, context + 1))
            with torch.inference_mode():
                engine.forward(
                    [StepItem("r", prompt, 0, [next(slot) for _ in prompt], True, GREEDY)]
                )
            times = [
                engine.forward([StepItem("r", [5], context + i, [next(slot)])]).forward_ms
                for i in range(20)
            ]
            out.append(
                {"dtype": str(dtype), "cudnn_sdp": cudnn, "decode_ms": statistics.median(times[3:])}
            )
        del model
    torch.backends.cuda.enable_cudnn_sdp(False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    names = [variant_name(*v) for v in VARIANTS] + ["exact"]
    parser.add_argument("--variants", nargs="+", choices=names, help="default: all")
    args = parser.parse_args()
    report = shape_report(args.shape, torch.bfloat16, args.context, args.batches, args.variants)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
