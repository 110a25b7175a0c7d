"""The target-only benchmark runs end to end (--quick) and records figures for both engines.

One batch size (2: concurrent streams, closed groups): each batch size starts a stack of its
own, and a second one would add a start and an HF phase (~16 s) that prove nothing new here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIGURES = ("decode_tok_s", "per_stream_decode_tok_s", "output_tok_s", "ttft_ms_mean", "wall_s")


@pytest.mark.slow
def test_quick_benchmark_writes_positive_figures(tmp_path: Path) -> None:
    out = tmp_path / "target_only.json"
    # A subprocess: the benchmark sets torch threads and starts services of its own.
    # About 45 s on a 2-core machine (a stack start, HF loading the GGUF, a phase each).
    command = ["--quick", "--batch-sizes", "2", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_target_only", *command],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())

    assert report["config"]["num_prompts"] == 2
    assert report["config"]["max_new_tokens"] == 8
    assert report["machine"]["torch_threads"] > 0 and report["machine"]["cpu_model"]
    phases = {(r["engine"], r["batch_size"]): r for r in report["results"]}
    assert set(phases) == {("splitspec", 2), ("hf", 2)}
    for key, phase in phases.items():
        assert phase["num_tokens"] == 2 * 8, key
        for name in FIGURES:
            assert phase[name] > 0, (key, name)
    assert [r["batch_size"] for r in report["ratios"]] == [2]
    assert all(r["decode_tok_s"] > 0 for r in report["ratios"])
