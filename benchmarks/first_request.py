"""A fresh stack's first requests: their TTFT with the target's start-up warm-up and without
(`serve --no-warm-up`), each stack on an empty Triton cache, as on a new machine or a new pod.

Each repeat starts one stack per arm, in an order that flips from repeat to repeat, times how
long it takes to serve, then sends a few prompts of differing lengths, each its own first words
(no prefix shared through the radix cache), and stops it. The JSON keeps every request's TTFT.

  python -m benchmarks.first_request --out benchmarks/results/first_request.json --label cpu
  python -m benchmarks.first_request --out F.json --label h100 --serve-args --device cuda \\
      --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

from benchmarks.run_record import machine_info, save_run, utc_now, versions
from benchmarks.twin_stacks import start_stack
from splitspec.client import Client, build_request
from splitspec.launcher import free_ports

ARMS = {"warm_up": [], "no_warm_up": ["--no-warm-up"]}
# Distinct openings, lengths from a few tokens to a few dozen: each prefill is the request's own.
PROMPTS = (
    "Name a color.",
    "Quickly explain why the sky looks blue during the day but red at sunset.",
    "Mountains, rivers and forests cover the region; write a short paragraph for a travel "
    "guide that tells a family what to see in two days and where to stay at night.",
    "Oranges, apples and pears were on the table when the guests arrived. Continue the story "
    "in four sentences, keeping the tone light, and end with a question that one of the "
    "guests asks the host about the garden behind the house.",
)


def one_stack(arm: str, serve_args: list[str], max_new_tokens: int) -> dict[str, Any]:
    """Starts a stack on an empty Triton cache, sends PROMPTS once each, stops it."""
    cache = tempfile.mkdtemp(prefix="triton-cache-")
    log = Path(tempfile.mkdtemp(prefix="first-request-")) / f"{arm}.log"
    port = free_ports(1)[0]
    started = time.perf_counter()
    process = start_stack(port, [f"TRITON_CACHE_DIR={cache}"], ARMS[arm] + serve_args, log)
    start_s = time.perf_counter() - started
    client = Client(f"127.0.0.1:{port}")
    try:
        ttft = []
        for prompt in PROMPTS:
            final = client.generate(build_request(prompt, False, max_new_tokens, 0.0)).final
            assert final is not None, "the stream ended without its final message"
            ttft.append(round(final.timings.time_to_first_token_ms, 1))
    finally:
        client.close()
        process.send_signal(signal.SIGINT)
        process.wait(120)
    print(f"{arm}: serving after {start_s:.1f} s, TTFT {ttft} ms", flush=True)
    return {"arm": arm, "start_s": round(start_s, 2), "ttft_ms": ttft}


def summary(stacks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in ARMS:
        mine = [s for s in stacks if s["arm"] == arm]
        out[arm] = {
            "start_s": round(mean(s["start_s"] for s in mine), 2),
            "first_ttft_ms": round(mean(s["ttft_ms"][0] for s in mine), 1),
            "later_ttft_ms": round(mean(t for s in mine for t in s["ttft_ms"][1:]), 1),
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    stacks = []
    for repeat in range(args.repeats):
        order = list(ARMS) if repeat % 2 == 0 else list(ARMS)[::-1]
        stacks += [one_stack(arm, args.serve_args, args.max_new_tokens) for arm in order]
    result = summary(stacks)
    print(result, flush=True)
    return {"benchmark": "first_request", "when": utc_now(), "serve_args": args.serve_args,
            "max_new_tokens": args.max_new_tokens, "prompts": list(PROMPTS),
            "stacks": stacks, "summary": result,
            "machine": machine_info(torch_threads=os.cpu_count() or 1),
            "versions": versions()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="stacks per arm")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", required=True, help="this run's key in --out")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                        help="the rest goes to every `splitspec serve` (last)")
    args = parser.parse_args(argv)
    save_run(args.out, args.label, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
