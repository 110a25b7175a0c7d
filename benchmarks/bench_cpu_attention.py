"""The target's CPU attention backends side by side: torch's (gather + SDPA) against the paged
C++ kernel (kernels/exact_attention.h), the default numerics otherwise.

  python -m benchmarks.bench_cpu_attention [--out benchmarks/results/cpu_attention.json]
                                           [--rounds 7]

In-process engines (no gRPC), fp32, the default model with its real weights and prepacked
copies: per round a 256-token prefill, eight one-token decodes after it and a 16-node chain
verify, on a fresh request (bench_exact.one_round); then the same at ~1000 tokens of context.
The two engines alternate round by round so that drift in the machine's load hits both;
medians of each, and paged / torch ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from benchmarks.bench_exact import NUM_SLOTS, one_round
from benchmarks.run_record import git_commit, utc_now
from model_runtime.loading import default_model_path, load_model
from model_runtime.packed_linear import prepack_linears
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import TargetEngine

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "cpu_attention.json"
BACKENDS = ("torch", "paged")


def engines() -> dict[str, TargetEngine]:
    """One model, prepacked once, behind an engine per backend (engines share no state)."""
    cache = default_cache_dir()
    model = load_model(default_model_path(), torch.float32, torch.device("cpu"), cache)
    prepack_linears(model, cache)
    out = {}
    for backend in BACKENDS:
        config = TargetConfig(model_path=default_model_path(), cache_dir=cache,
                              num_slots=NUM_SLOTS, attention=backend)  # fmt: skip
        out[backend] = TargetEngine(config, model)
    assert out["paged"].paged and not out["torch"].paged
    return out


def step_phase(rounds: int, context: int) -> dict:
    targets = engines()
    times: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for name, target in targets.items():
                measured = one_round(target, r, context)
                if r:
                    times[name].append(measured)
    medians = {
        name: {key: round(statistics.median(t[key] for t in rows), 2) for key in rows[0]}
        for name, rows in times.items()
    }
    paged, plain = medians["paged"], medians["torch"]
    ratios = {key: round(paged[key] / plain[key], 3) for key in paged}
    return {"context": context, "medians_ms": medians, "paged_over_torch": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    report = {"date": utc_now(), "commit": git_commit(), "threads": torch.get_num_threads(),
              "phases": [step_phase(args.rounds, context) for context in (256, 1000)]}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
