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
        ax.bar_label(bars, fmt=lambda v: "" if v != v else f"{v:.2f}", fontsize=7)  # nan: none
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


GPU_RUN, GPU_CALL = "gpu_spin_2026-12-03.json", "call_14_58"  # the latest side-by-side call


def _gpu_call() -> dict:
    return _load(GPU_RUN)[GPU_CALL]


def gpu_round(ax) -> str:
    """Where a batch-1 EAGLE round goes on the H200: device time and the rest, stacked."""
    timing = _gpu_call()["spec_bf16_switch_spin"]["spec_bf16"]["speculative"]["round_ms"]
    parts = {
        "target device": timing["target_device_ms"],
        "target host + RPC": timing["target_call_ms"] - timing["target_device_ms"],
        "draft device": timing["draft_device_ms"],
        "draft host + RPC (wait left)": timing["draft_call_ms"] - timing["draft_device_ms"],
        "router": timing["router_ms"],
    }
    left = 0.0
    for name, ms in parts.items():
        ax.barh(["round"], [ms], left=left, label=f"{name} {ms:.2f} ms")
        left += ms
    share = timing["not_device_share"]
    ax.set_xlabel("ms")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    ax.set_title(f"A batch-1 EAGLE round on the H200 (idle spinners): {left:.2f} ms, "
                 f"{share:.0%} not device time", fontsize=9)  # fmt: skip
    return "gpu_round.png"


def gpu_speculation(ax) -> str:
    """EAGLE against target-only on the H200, with and without idle spinners: by prompt set
    at batch 1 (replies ending at EOS), and the switch (spinners) by batch size."""
    call = _gpu_call()
    spin, plain = call["prompt_sets_spin"], call["prompt_sets_plain"]
    switch = call["spec_bf16_switch_spin"]["switch"]
    groups = [f"batch 1\n{r['prompt_set']}" for r in spin["prompt_sets"]]
    groups += [f"batch {r['batch']}\nswitch" for r in switch]
    nothing = [float("nan")] * len(switch)  # the switch ran with spinners only
    _bars(ax, groups, {
        "--keep-cpus-awake spin": [r["ratio"] for r in spin["prompt_sets"]]
        + [r["ratio"] for r in switch],
        "nothing held": [r["ratio"] for r in plain["prompt_sets"]] + nothing,
    }, "x target-only")  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"EAGLE on the H200, bf16, whole stack ({spin['date'][:10]})")
    return "gpu_speculation.png"


PLOTS: list[Callable] = [
    speculative_speed, acceptance_by_shape, target_only_vs_hf, hot_vocab, gpu_round,
    gpu_speculation,
]


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
