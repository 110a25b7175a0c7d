"""`splitspec bench`: a running router under a load of real prompts, as a user sees it (time to
first token, time per output token, throughput, acceptance), and by default the same prompts
with speculation on and off side by side, greedy outputs compared.

Without ``--request-rate`` the load is a closed loop: arms run in waves of ``--concurrency``
requests started together; the arms take turns wave by wave (which goes first alternates), so
a drift in the machine's load touches both alike. Each arm first sends one warm-up request that
is not counted. With two arms, each wave's prompts are prefilled once (one token, not counted)
before the arms run them: the router's prefix cache would otherwise give the second arm the
first arm's prefill, so both arms' prompts are cached alike (a wave of long prompts moved a CPU
comparison by 0.1x). With ``--request-rate`` it is an open loop
(splitspec/bench_open_loop.py), every prompt prefilled once before the arms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import grpc
from tqdm import tqdm

from plumbing.arg_types import POSITIVE_FLOAT, POSITIVE_INT, int_between, number_at_least
from splitspec.bench_open_loop import run_open_loop
from splitspec.bench_prompts import SOURCES_HELP, PromptError, load_prompts
from splitspec.bench_report import arm_summary, print_report
from splitspec.bench_requests import BenchConfig, Sample, send_one
from splitspec.client import Client, describe_rpc_error
from splitspec.connection import add_connection_flags, connection_from_args

ARMS = {"compare": ("target-only", "speculative"), "on": ("speculative",),
        "off": ("target-only",), "server": ("server",)}  # fmt: skip
PRIME_AT_ONCE = 16  # prompts prefilled together before an open loop


def run_bench(client: Client, config: BenchConfig, progress: bool = True) -> dict[str, list]:
    """Every arm's samples, in prompt order."""
    for arm in config.arms:
        send_one(client, config, arm, 0, wave=-1)  # warm-up: first calls, caches, graphs
    total = len(config.prompts) * len(config.arms)
    with tqdm(total=total, unit="req", disable=not progress, file=sys.stderr) as bar:
        if config.request_rate is None:
            return _in_waves(client, config, bar)
        indices = range(len(config.prompts))
        for start in range(0, len(indices), PRIME_AT_ONCE):
            _prime(client, config, indices[start : start + PRIME_AT_ONCE], -1)
        return {arm: run_open_loop(client, config, arm, lambda: bar.update(1))
                for arm in config.arms}  # fmt: skip


def _in_waves(client: Client, config: BenchConfig, bar: tqdm) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {arm: [] for arm in config.arms}
    waves = range(0, len(config.prompts), config.concurrency)
    for number, start in enumerate(waves):
        order = config.arms if number % 2 == 0 else config.arms[::-1]
        indices = range(start, min(start + config.concurrency, len(config.prompts)))
        _prime(client, config, indices, number)
        for arm in order:
            samples[arm] += _wave(client, config, arm, indices, number)
            bar.update(len(indices))
    return samples


def _prime(client: Client, config: BenchConfig, indices: range, wave: int) -> None:
    """With two arms, the prompts prefilled once (one token, not counted) before either arm."""
    if len(config.arms) > 1:
        _wave(client, replace(config, max_new_tokens=1), "target-only", indices, wave)


def _wave(
    client: Client, config: BenchConfig, arm: str, indices: range, wave: int
) -> list[Sample]:
    with ThreadPoolExecutor(len(indices)) as pool:
        return list(pool.map(lambda i: send_one(client, config, arm, i, wave), indices))


def bench_record(config: BenchConfig, samples: dict[str, list[Sample]], address: str) -> dict:
    """The JSON `--out` writes: the settings, each arm's figures, and every sample."""
    arms = {arm: arm_summary(s) for arm, s in samples.items()}
    record: dict = {
        "benchmark": "splitspec bench",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "router": address,
        "settings": {k: v for k, v in asdict(config).items() if k != "prompts"},
        "num_prompts": len(config.prompts),
        "arms": arms,
    }
    if set(samples) == {"target-only", "speculative"}:
        record["comparison"] = _comparison(samples, arms)
    record["samples"] = [asdict(s) for arm in samples.values() for s in arm]
    return record


def _comparison(samples: dict[str, list[Sample]], arms: dict[str, dict]) -> dict:
    """The arms' ratios from their summaries, and how many outputs matched: greedy, or sampled
    with the same seeds in both arms, a verify emits target-only's tokens. Below
    saturation an open loop's throughput is its arrival rate in both arms: there the mean
    request time tells the arms apart."""
    base, spec = samples["target-only"], samples["speculative"]
    base_rate = arms["target-only"]["output_tokens_per_s"]
    ratio = arms["speculative"]["output_tokens_per_s"] / base_rate if base_rate else 0.0
    base_e2e = arms["target-only"]["e2e_ms"].get("mean", 0.0)
    spec_e2e = arms["speculative"]["e2e_ms"].get("mean", 0.0)
    time_ratio = spec_e2e / base_e2e if base_e2e else 0.0
    out: dict = {"speedup": ratio, "mean_request_time_ratio": time_ratio}
    pairs = [(a, b) for a, b in zip(base, spec, strict=True) if not (a.error or b.error)]
    out["outputs_equal"] = sum(a.token_ids == b.token_ids for a, b in pairs)
    out["outputs_compared"] = len(pairs)
    return out


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="load a running router with real prompts: TTFT, time per token, throughput, "
        "acceptance; speculation on and off side by side",
    )
    add_connection_flags(p)
    load = p.add_argument_group("load")
    load.add_argument("--prompts", default="builtin", help=SOURCES_HELP)
    load.add_argument("--num-prompts", type=POSITIVE_INT, default=16,
                      help="requests an arm sends (the prompt set repeats if smaller)")
    load.add_argument("--concurrency", type=POSITIVE_INT,
                      help="requests in flight at once (default 1: a wave starts together); "
                      "with --request-rate, the most in flight (default: no limit): an "
                      "arrival past it waits for a slot, and its clock (TTFT, request time) "
                      "starts when it gets one, not at its arrival (as vLLM's "
                      "--max-concurrency)")
    load.add_argument("--request-rate", type=POSITIVE_FLOAT, metavar="PER_S",
                      help="an open loop: requests leave at Poisson arrival times, this many a "
                      "second on average, whatever the router's pace (default: waves); under "
                      "--concurrency a request's times count from its slot, not its arrival")
    load.add_argument("--max-new-tokens", type=int_between(1, 2**32 - 1), default=128,
                      help="most tokens a request generates")
    load.add_argument("--temperature", type=number_at_least(float, 0), default=0.0,
                      help="0 (default): greedy, and the arms' outputs are compared")
    load.add_argument("--seed", type=int_between(0, 2**63), default=0,
                      help="sampled requests: seed + prompt index")
    load.add_argument("--raw", action="store_true",
                      help="send each prompt as raw text, not as a chat message")
    load.add_argument("--speculation", choices=sorted(ARMS), default="compare",
                      help="compare (default): target-only and speculative arms; on / off: "
                      "one arm; server: the router's own choice per request")
    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, help="write the figures and every sample as JSON")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=bench_main)  # fmt: skip


def bench_main(args: argparse.Namespace) -> int:
    connection = connection_from_args(args)
    try:
        prompts = load_prompts(args.prompts, args.num_prompts)
    except PromptError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    concurrency = args.concurrency or (0 if args.request_rate else 1)  # 0: no limit
    config = BenchConfig(prompts, ARMS[args.speculation], concurrency, args.max_new_tokens,
                         args.temperature, args.seed, not args.raw, args.request_rate)  # fmt: skip
    with Client.connect(connection) as client:
        try:
            client.status()  # unreachable, wrong key, not a router: one line, before any load
        except grpc.RpcError as err:
            print(f"error: {describe_rpc_error(err, connection)}", file=sys.stderr)
            return 1
        try:
            samples = run_bench(client, config, progress=not args.no_progress)
        except KeyboardInterrupt:  # the channel closes on the way out: the router aborts
            print("\ninterrupted", file=sys.stderr)
            return 130
    record = bench_record(config, samples, connection.address)
    print_report(record, args.prompts)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if any(s.error for arm in samples.values() for s in arm) else 0
