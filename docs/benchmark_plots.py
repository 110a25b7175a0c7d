"""Plots of the committed benchmark results (benchmarks/results/*.json), for the docs.

Rendered by docs/build.py into docs/plots/. Each plot reads one JSON file and nothing else,
so a re-run benchmark updates its plot by `make docs` alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [x + i * width for x in range(len(groups))]
        bars = ax.bar(xs, values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def speculative_speed(ax) -> str:
    data = _load("speculative_cpu.json")
    rows = data["results"]
    groups = [r["setting"]["name"] for r in rows]
    _bars(ax, groups, {
        "speculative": [r["speculative_batch1"]["tok_s"] for r in rows],
        "target-only": [r["target_only_batch1"]["tok_s"] for r in rows],
    }, "output tokens / s (batch 1)")
    ax.set_title(f"Speculative vs target-only, CPU ({data['date']})")
    return "speculative_speed.png"


def acceptance_by_shape(ax) -> str:
    data = _load("speculative_cpu.json")
    rows = data["results"]
    datasets = list(rows[0]["acceptance"])
    _bars(ax, [r["setting"]["name"] for r in rows], {
        ds: [r["acceptance"][ds]["mean_acceptance_length"] or 0 for r in rows] for ds in datasets
    }, "tokens per verify step")
    ax.set_title("Mean acceptance length by draft shape")
    return "acceptance_by_shape.png"


def target_only_vs_hf(ax) -> str:
    data = _load("target_only_cpu.json")
    rows = data["results"]
    sizes = sorted({r["batch_size"] for r in rows})
    engines = sorted({r["engine"] for r in rows})
    speed = {(r["engine"], r["batch_size"]): r["output_tok_s"] for r in rows}
    _bars(ax, [f"batch {b}" for b in sizes],
          {e: [speed.get((e, b), 0) for b in sizes] for e in engines}, "output tokens / s")
    ax.set_title("Target-only decoding: splitspec vs HF transformers, CPU")
    return "target_only_vs_hf.png"


def hot_vocab(ax) -> str:
    data = _load("hot_vocab_cpu.json")["results"]
    sizes = list(data)
    series = {f"{ds} {shape}": [data[s][ds][shape] for s in sizes]
              for ds in data[sizes[0]] for shape in ("tree", "chain")}
    _bars(ax, [s.replace("_", " ") for s in sizes], series, "tokens per verify step")
    ax.set_title("Acceptance with a hot draft vocabulary (offline replay)")
    return "hot_vocab.png"


PLOTS: list[Callable] = [speculative_speed, acceptance_by_shape, target_only_vs_hf, hot_vocab]


def render_all(out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in PLOTS:
        fig, ax = plt.subplots(figsize=(7, 4))
        name = plot(ax)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110, metadata={"Software": None})
        plt.close(fig)
        written.append(out_dir / name)
    return written
