"""Host-side torch work of one greedy Verify on the fixed-shape path, outside the graph's body.

On CUDA the verify step's body (``VerifyGraphRunner._body``) is one graph replay; everything
else the engine does with torch in ``TargetEngine.verify`` is eager host work, each op or
small copy 10-50 us on the H200 box. This counts that work on the CPU, where the same code
runs with the body eager: the tests' tiny Llama, a VerifyGraphRunner attached with
use_graphs=False, greedy trees that fit its buckets. Per Verify call, outside the body
(counted by benchmarks/host_op_counting.py):

- ``torch_calls``: torch functions and methods called from Python (TorchFunctionMode; property
  reads such as ``.shape`` left out), including those that dispatch nothing on the CPU, such
  as ``.to(device)`` of a tensor already there;
- ``aten_ops``: ATen ops dispatched (TorchDispatchMode), views included;
- ``h2d`` / ``d2h``: copies that cross to or from the device on CUDA. On the CPU everything
  is host memory, so the direction comes from where a tensor lives on CUDA: the runner's
  static buffers, the KV pools and the slot table are device memory, and so is whatever
  ``.to(device)`` or ``torch.tensor(..., device=)`` returns or an op derives from device
  tensors; ``tolist()`` of device memory is a read back.

Counts are split into the admission (``admit_trees``: the slot table's write, not the verify
step's) and the rest of the call; ``body_aten_ops`` is what the body dispatched (one replay on
CUDA, left out of the totals). ``host_us``: median wall time of the call outside the body and,
of it, the admission's, uninstrumented, on this machine. On a CPU that has just run the body
(12 MB of logits for 64 nodes) everything after it runs cache-cold and slow, so
``host_us_body_skipped`` times the same calls with a body that does nothing (their results
repeat the last real step's): the host's own work with warm caches, closer to a GPU box.

    python -m benchmarks.host_ops --label after --out benchmarks/results/host_ops_cpu.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from benchmarks.host_op_counting import AtenOps, HostOps, phased
from benchmarks.run_record import machine_info, save_run, utc_now, versions
from model_runtime.loading import load_model
from plumbing.paths import default_cache_dir
from target_service import engine as engine_module
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.request_table import SamplingSpec
from target_service.verify_graphs import VerifyGraphRunner
from tests.helpers.tiny_llama import E2E_MODEL, tiny_llama_dir

GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
NUM_SLOTS = 8192
PROMPT_LEN = 8
# name: (nodes of each tree, return_hidden): one EAGLE request (the CUDA default tree has 64
# nodes), a small tree, a batch of three with padding, a batch that wants no hidden rows.
SCENARIOS = {
    "1x64_hidden": ([64], True),
    "1x16_hidden": ([16], True),
    "3x[10,13,7]_hidden": ([10, 13, 7], True),
    "2x[16,9]_no_hidden": ([16, 9], False),
}


def make_engine(model_dir: Path) -> TargetEngine:
    config = TargetConfig(
        model_path=model_dir, cache_dir=default_cache_dir(), dtype="float32",
        num_slots=NUM_SLOTS, device="cpu", attention="paged",
    )  # fmt: skip
    model = load_model(model_dir, torch.float32, torch.device("cpu"), default_cache_dir())
    engine = TargetEngine(config, model)
    runner = VerifyGraphRunner(model, engine.pools, engine.table.slots, use_graphs=False)
    runner.capture_all()
    engine.attach_verify_graphs(runner)
    return engine


class Requests:
    """Prefilled requests and the trees of their next Verify calls (random drafts, new slots
    for each tree, so every call appends to the slot table as the router's do)."""

    def __init__(self, engine: TargetEngine, sizes: list[int], want_hidden: bool) -> None:
        self.engine, self.sizes, self.want_hidden = engine, sizes, want_hidden
        self.rng = random.Random(0)
        self.slots = iter(range(NUM_SLOTS))
        self.ids = [f"r{i}" for i in range(len(sizes))]
        self.starts = [PROMPT_LEN - 1] * len(sizes)
        self.table_len = [PROMPT_LEN - 1] * len(sizes)
        prompt = [self.rng.randrange(3, 1000) for _ in range(PROMPT_LEN - 1)]
        engine.forward([StepItem(rid, prompt, 0, self.take(len(prompt)), False, GREEDY)
                        for rid in self.ids])  # fmt: skip

    def take(self, count: int) -> list[int]:
        return [next(self.slots) for _ in range(count)]

    def next_items(self) -> list[VerifyItem]:
        items = []
        for i, nodes in enumerate(self.sizes):
            tokens = [self.rng.randrange(3, 1000) for _ in range(nodes)]
            parents = [-1, *(self.rng.randrange(j) for j in range(1, nodes))]
            needed = self.starts[i] + nodes - self.table_len[i]
            self.table_len[i] += max(needed, 0)
            items.append(VerifyItem(self.ids[i], self.starts[i], tokens, parents,
                                    self.take(max(needed, 0)), self.want_hidden))  # fmt: skip
        return items

    def verify(self, items: list[VerifyItem]) -> None:
        results = self.engine.verify(items).results
        for i, r in enumerate(results):
            self.starts[i] += 1 + r.num_accepted


def count_one(engine: TargetEngine, requests: Requests) -> dict[str, Any]:
    runner = engine.verify_graphs
    assert runner is not None
    device_tensors = [*engine.pools.all_pools(), engine.table.slots, runner.node_ids]
    device_tensors += [t for t in vars(runner.buffers).values() if isinstance(t, torch.Tensor)]
    items = requests.next_items()
    phases = HostOps(device_tensors)
    with (
        mock.patch.object(runner, "_body", phased(phases, "body", runner._body)),
        mock.patch.object(engine_module, "admit_trees", phased(phases, "admission",
                                                               engine_module.admit_trees)),
        mock.patch.object(runner, "run", wraps=runner.run) as spy,
        phases,
        AtenOps(phases),
    ):  # fmt: skip
        requests.verify(items)
    assert spy.call_count == 1, "the call did not take the fixed-shape path"
    kinds = ("torch_calls", "aten_ops", "h2d", "d2h")
    per_phase = {
        p: {k: phases.counts[f"{p}.{k}"] for k in kinds} | {"calls": dict(phases.by_name[p])}
        for p in ("admission", "verify")
    }
    return {**per_phase, "body_aten_ops": phases.counts["body.aten_ops"]}


def host_us(engine: TargetEngine, requests: Requests, calls: int, run_body: bool) -> dict:
    """Median wall time of a Verify call outside the body, and of its admission, uninstrumented.
    Without ``run_body`` the body does nothing (results repeat the last real step's): the
    host's own work with its caches warm, as on a box whose device runs the body."""
    runner = engine.verify_graphs
    assert runner is not None
    spent = Counter[str]()
    samples: list[dict[str, float]] = []
    body = runner._body if run_body else lambda *shape: None
    with (
        mock.patch.object(runner, "_body", timed(spent, "body", body)),
        mock.patch.object(engine_module, "admit_trees", timed(spent, "admission",
                                                              engine_module.admit_trees)),
    ):  # fmt: skip
        for _ in range(calls):
            items = requests.next_items()
            spent.clear()
            started = time.perf_counter()
            requests.verify(items)
            total = time.perf_counter() - started
            samples.append({"outside_body": total - spent["body"], "admission": spent["admission"]})
    return {k: round(statistics.median(s[k] for s in samples) * 1e6, 1) for k in samples[0]}


def timed(spent: Counter[str], key: str, func: Callable) -> Callable:
    def wrapped(*args, **kwargs):
        started = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - started

    return wrapped


def measure(model_dir: Path, calls: int) -> dict[str, Any]:
    report = {}
    for name, (sizes, want_hidden) in SCENARIOS.items():
        engine = make_engine(model_dir)
        requests = Requests(engine, sizes, want_hidden)
        requests.verify(requests.next_items())  # warm-up
        counts = [count_one(engine, requests) for _ in range(3)]
        assert all(c == counts[0] for c in counts), f"{name}: counts vary between calls {counts}"
        report[name] = {
            "per_call": counts[0],
            "host_us": host_us(engine, requests, calls, run_body=True),
            "host_us_body_skipped": host_us(engine, requests, calls, run_body=False),
        }
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", default="run")
    parser.add_argument("--machine-name", default="2-core dev box (CPU)")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per scenario")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--code", default="this checkout", help="what code ran, for the record")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="splitspec-host-ops-") as root:
        model_dir = tiny_llama_dir(Path(root), replace(E2E_MODEL, with_tokenizer=False))
        scenarios = measure(model_dir, args.calls)
    report = {
        "label": args.label, "when": utc_now(), "machine_name": args.machine_name,
        "machine": machine_info(torch.get_num_threads()),
        "versions": versions(("splitspec", "torch", "numpy")),
        "code": args.code,
        "model": "tests/helpers/tiny_llama.py E2E_MODEL (hidden 32, one layer), float32",
        "scenarios": scenarios,
    }  # fmt: skip
    print(json.dumps(report["scenarios"], indent=1))
    if args.out:
        save_run(args.out, args.label, report)
        print(f"wrote {args.out} ({args.label})")


if __name__ == "__main__":
    main()
