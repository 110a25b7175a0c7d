"""In-process cost of logprobs on the target (target_service/logprobs.py): a greedy verify of
a 4-node chain (the verify graphs on CUDA) and an 8-step decode Forward, each timed for a
request that asks for logprobs (top 0 and top 20) and for one that does not, steps alternating;
and the pass alone. Then a 512-token prefill chunk that scores the prompt tokens after its own
(prompt log-probabilities, target_service/prompt_scores.py; top 0 and top 20) against one
that does not. Every step repeats at the same positions, so the state does not grow.

  python -m benchmarks.gpu_logprobs_pass [--device cuda --dtype bfloat16] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from benchmarks.gpu_stack import chat_ids
from benchmarks.run_record import utc_now, versions
from model_runtime.loading import default_model_path
from plumbing.paths import default_cache_dir
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine, VerifyItem
from target_service.logprobs import device_pass
from target_service.request_table import SamplingSpec
from target_service.server import build_engine

CHAIN = 4
STEPS = 8
PREFILL = 512
SPECS = {
    "off": SamplingSpec(0.0, 1.0, 0, 0),
    "top0": SamplingSpec(0.0, 1.0, 0, 0, logprobs=True),
    "top20": SamplingSpec(0.0, 1.0, 0, 0, logprobs=True, top_logprobs=20),
}


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def read_pass(*args) -> list:
    """The pass alone, on rows already in the pool, and its read-back."""
    return device_pass(*args).tolist()


def open_requests(engine: TargetEngine, prompt: list[int]) -> dict[str, list[int]]:
    """Each spec's request prefilled, and its greedy continuation (the chain to verify)."""
    chains = {}
    for i, (name, spec) in enumerate(SPECS.items()):
        base = 1000 * i
        first = engine.forward(
            [StepItem(name, prompt, 0, list(range(base, base + 1000)), True, spec)]
        )
        ids = list(first.next_token_ids)
        while len(ids) < CHAIN:
            start = len(prompt) + len(ids) - 1
            ids += engine.forward([StepItem(name, [ids[-1]], start)]).next_token_ids
        chains[name] = ids
    return chains


def time_steps(engine: TargetEngine, prompt: list[int], repeats: int) -> dict:
    chains = open_requests(engine, prompt)
    start = len(prompt)
    verify = {n: VerifyItem(n, start, c, list(range(-1, CHAIN - 1))) for n, c in chains.items()}
    decode = {n: StepItem(n, [c[0]], start) for n, c in chains.items()}
    out: dict[str, float] = {}
    for _ in range(3):  # rounds of every kind in turn: drift hits them alike
        for name in SPECS:
            out[f"verify_{name}_ms"] = median_ms(partial(engine.verify, [verify[name]]), repeats)
            step = partial(engine.forward, [decode[name]], STEPS)
            out[f"decode8_{name}_ms"] = median_ms(step, repeats)
    state = engine.table.get("top20")
    for rows in (CHAIN, STEPS):
        slots = engine.table.slots[state.row, start : start + rows]
        tokens = torch.tensor(chains["top20"][:1] * rows, device=slots.device)
        for top in (0, 20):
            args = (engine.model, engine.pools.hidden[slots], tokens, top)
            out[f"pass_rows{rows}_top{top}_ms"] = median_ms(partial(read_pass, *args), repeats)
    return out


def time_prefill(engine: TargetEngine, prompt: list[int], repeats: int) -> dict:
    """A PREFILL-token chunk run again and again at positions 0.., scoring its successors
    (each spec's top count) or, for "off", nothing."""
    ids = (prompt * (PREFILL // len(prompt) + 1))[:PREFILL]
    items = {}
    for i, (name, spec) in enumerate(SPECS.items()):
        rid, base = f"prefill-{name}", 3000 + PREFILL * i
        engine.forward([StepItem(rid, ids, 0, list(range(base, base + PREFILL)), True, spec)])
        scored = [] if name == "off" else [*ids[1:], ids[0]]
        items[name] = StepItem(rid, ids, 0, [], True, None, scored)
    out: dict[str, float] = {}
    for _ in range(3):
        for name, item in items.items():
            step = partial(engine.forward, [item])
            out[f"prefill{PREFILL}_{name}_ms"] = median_ms(step, repeats)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--prefill-repeats", type=int, default=20)
    p.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = p.parse_args()
    config = TargetConfig(
        model_path=default_model_path(), cache_dir=default_cache_dir(), device=args.device,
        dtype=args.dtype, num_slots=6144, max_decode_steps=STEPS,
        verify_graphs=args.device.startswith("cuda"),
    )  # fmt: skip
    engine = build_engine(config)
    prompt = list(chat_ids(["Name three colours of the rainbow."])[0])
    record = {"benchmark": "logprobs_pass", "when": utc_now(), "device": args.device,
              "dtype": args.dtype, **time_steps(engine, prompt, args.repeats),
              **time_prefill(engine, prompt, args.prefill_repeats),
              "versions": versions()}  # fmt: skip
    print(json.dumps(record, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
