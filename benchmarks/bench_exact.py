"""What the target's --exact mode costs on CPU: step times of the default model, side by side.

  python -m benchmarks.bench_exact [--out benchmarks/results/exact_cpu.json] [--rounds 5]
                                   [--stack-prompts 6]

In-process engines (no gRPC), fp32, the default model with its real weights: a one-token decode
after a 256-token prefill, a 16-node chain verify, and the prefill, for the default numerics
(--attention auto: the paged C++ attention on an AVX-512 CPU since 2026-12-06, torch's before;
the few-row kernel up to its timed row limits) and --exact (the paged C++ attention, the
few-row kernel for every row count). The two engines alternate round by round so that drift in
the machine's load hits both; medians of each.

Then end to end: two whole stacks (router, target, one EAGLE replica), default and --exact, one
after the other: batch-1 greedy tok/s with speculation on and off (interleaved prompt by prompt)
over held-out ShareGPT prompts (0 prompts skips this phase).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.run_record import git_commit, utc_now
from model_runtime.loading import default_model_path, load_model
from model_runtime.packed_linear import prepack_linears
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.request_table import SamplingSpec

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "exact_cpu.json"
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
CONTEXT = 200
NUM_SLOTS = 8192


def engine(exact: bool) -> TargetEngine:
    cache = default_cache_dir()
    model = load_model(default_model_path(), torch.float32, torch.device("cpu"), cache)
    prepack_linears(model, cache, exact=exact)
    config = TargetConfig(model_path=default_model_path(), cache_dir=cache, num_slots=NUM_SLOTS,
                          attention="paged" if exact else "auto", exact=exact)  # fmt: skip
    return TargetEngine(config, model)


def one_round(target: TargetEngine, round_index: int, context: int = 256) -> dict[str, float]:
    """ms of a ``context``-token prefill, then a decode step (median of 8) and a 16-node verify
    after it, on a fresh request."""
    slots = iter(range(NUM_SLOTS))
    rid = f"r{round_index}"
    prompt = [(37 * i) % 5000 + 10 for i in range(context)]
    started = time.perf_counter()
    target.forward([StepItem(rid, prompt, 0, [next(slots) for _ in prompt], True, GREEDY)])
    prefill_ms = (time.perf_counter() - started) * 1e3
    decode = [target.forward([StepItem(rid, [5], context + i, [next(slots)])]).forward_ms
              for i in range(8)]  # fmt: skip
    tree = VerifyItem(rid, context + 8, [5] * 16, [-1, *range(15)],
                      [next(slots) for _ in range(16)])  # fmt: skip
    verify_ms = target.verify([tree]).forward_ms
    target.release([rid])
    return {f"prefill{context}_ms": prefill_ms, "decode_ms": statistics.median(decode),
            "verify16_ms": verify_ms}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stack-prompts", type=int, default=6)
    args = parser.parse_args(argv)
    report = {"date": utc_now(), "commit": git_commit(), "threads": torch.get_num_threads(),
              **step_phase(args.rounds)}  # fmt: skip
    if args.stack_prompts:
        report["stacks_batch1"] = stack_phase(args.stack_prompts)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


def step_phase(rounds: int) -> dict:
    engines = {"default": engine(False), "exact": engine(True)}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for name, target in engines.items():
                times = one_round(target, r)
                if r:
                    rows[name].append(times)
    medians = {
        name: {key: statistics.median(t[key] for t in times) for key in times[0]}
        for name, times in rows.items()
    }
    ratios = {key: medians["exact"][key] / medians["default"][key] for key in medians["exact"]}
    return {"medians_ms": medians, "exact_over_default": ratios}


def stack_phase(num_prompts: int) -> dict:
    """One stack after the other: two at once on a 2-core box contend (seen: ~2 tok/s)."""
    from benchmarks.bench_speculative import batch1_speed, sharegpt_heldout
    from splitspec.client import Client
    from splitspec.launcher import LocalStack

    prompts = sharegpt_heldout(num_prompts)
    out = {}
    for name, extra in (("default", []), ("exact", ["--exact"])):
        stack = LocalStack(["--device", "cpu", "--dtype", "float32", *extra], [],
                           log_dir=Path(tempfile.mkdtemp(prefix=f"bench-exact-{name}-")),
                           draft_args=[["--method", "eagle", "--dtype", "float32"]])  # fmt: skip
        with stack:
            client = Client(stack.router_address)
            out[name] = _speed_totals([batch1_speed(client, [p], 96) for p in prompts])
            client.close()
    return out


def _speed_totals(rows: list[dict]) -> dict:
    out = {}
    for mode in ("speculative", "target_only"):
        tokens = sum(r[mode]["tokens"] for r in rows)
        wall = sum(r[mode]["wall_s"] for r in rows)
        out[mode] = {"tokens": tokens, "wall_s": round(wall, 2), "tok_s": round(tokens / wall, 2)}
    out["speedup"] = round(out["speculative"]["tok_s"] / out["target_only"]["tok_s"], 3)
    out["outputs_differing"] = sum(
        r["speculative"]["outputs_differing_from_target_only"] for r in rows
    )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
