"""What benchmarks/bench_speculative.py writes once its settings have run: the JSON report
(with the machine and the short commit), the PNG of acceptance by tree shape and the table."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from benchmarks.run_record import REPO_ROOT, cpu_model


def machine() -> dict:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "commit": commit,
    }


def write_report(args: argparse.Namespace, results: list[dict]) -> None:
    report = {
        "benchmark": "speculative_cpu",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "config": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["setting"]["name"] for r in results]
    datasets = list(results[0]["acceptance"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(datasets)
    for i, ds in enumerate(datasets):
        values = [r["acceptance"][ds]["mean_acceptance_length"] or 0 for r in results]
        ax.bar([x + i * width for x in range(len(names))], values, width, label=ds)
    labels = [
        f"{r['setting']['name']}\n({r['setting']['num_steps']},{r['setting']['topk']},"
        f"{r['setting']['num_draft_tokens']})"
        for r in results
    ]
    ax.set_xticks([x + width * (len(datasets) - 1) / 2 for x in range(len(names))], labels)
    ax.set_ylabel("mean acceptance length (tokens / verify step)")
    ax.set_title("splitspec on SmolLM2-135M, greedy, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_table(results: list[dict]) -> None:
    print(f"\n{'setting':<12} {'spec tok/s':>10} {'target tok/s':>12} {'speedup':>8}  acceptance")
    for r in results:
        acc = ", ".join(f"{k} {v['mean_acceptance_length']}" for k, v in r["acceptance"].items())
        print(
            f"{r['setting']['name']:<12} {r['speculative_batch1']['tok_s']:>10} "
            f"{r['target_only_batch1']['tok_s']:>12} {r['speedup_batch1']:>8}  {acc}"
        )
