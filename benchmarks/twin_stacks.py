"""Two `splitspec serve` stacks at once, A and B, differing only in their environment or in
some of their flags, with requests alternating between them: a paired A/B on a box whose speed
drifts.

On the 2-core dev box the same stack's tok/s moves by a quarter within half an hour, so two
stacks run one after the other compare the box's minutes as much as the change. Here both
stacks are up together and take turns request by request (the idle one's processes sleep), so
drift reaches both alike. Each prompt runs four times per round, on each stack with speculation
on (the server's choice with ``--switch``, else forced) and off, in an order that flips from
prompt to prompt. An A/A run (``--env-b`` equal to ``--env-a``) measures what the method itself
leaves: 0.98-1.02x on 2026-12-06; but later A/Bs run in both orders found one stack ahead in
both, by 3-5% (B in benchmarks/results/cpu_draft_threads_2026-12-06.json, A in
cpu_omp_release_2026-12-06.json). So run a change in
both orders (``--args-a`` then ``--args-b``): the change's effect is the geometric mean of
its ratio over the two runs.

  python -m benchmarks.twin_stacks --env-a GOMP_SPINCOUNT=300000 --rounds 3 \
      --out benchmarks/results/cpu_omp_spin_2026-12-06.json --label new_forced
  python -m benchmarks.twin_stacks --args-b "--draft-threads 1" --out F.json --label threads
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.run_record import machine_info, save_run, utc_now, versions
from splitspec.bench_prompts import load_prompts
from splitspec.client import Client, build_request
from splitspec.launcher import free_ports

STACKS = ("A", "B")


def start_stack(port: int, env: list[str], serve_args: list[str], log: Path) -> subprocess.Popen:
    """`splitspec serve` on ``port`` with ``env`` (NAME=VALUE) added; returns once it serves."""
    extra = dict(item.split("=", 1) for item in env)
    command = [sys.executable, "-m", "splitspec.cli", "serve", "--port", str(port), *serve_args]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **extra})  # fmt: skip
    deadline = time.monotonic() + 600
    while b"serving;" not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait(60)
            raise RuntimeError(f"serve on {port} did not start: {log.read_text()[-2000:]}")
        time.sleep(1)
    return process


def one_round(clients: dict[str, Client], prompts: list[str], args: argparse.Namespace,
              round_index: int) -> list[dict[str, Any]]:  # fmt: skip
    order = [(name, spec) for spec in (True, False) for name in STACKS]
    rows = []
    for i, prompt in enumerate(prompts):
        for name, spec in order if (round_index + i) % 2 == 0 else order[::-1]:
            speculate = None if (spec and args.switch) else spec
            request = build_request(prompt, True, args.max_new_tokens, 0.0, speculate=speculate)
            result = clients[name].generate(request)
            rows.append({"round": round_index, "prompt": i, "stack": name, "speculation": spec,
                         "tokens": list(result.token_ids), "seconds": result.seconds})  # fmt: skip
    return rows


def tok_per_s(rows: list[dict[str, Any]], stack: str, spec: bool) -> float:
    chosen = [r for r in rows if r["stack"] == stack and r["speculation"] == spec]
    return sum(len(r["tokens"]) for r in chosen) / sum(r["seconds"] for r in chosen)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rates = {f"{s}_{'on' if spec else 'off'}": round(tok_per_s(rows, s, spec), 2)
             for s in STACKS for spec in (True, False)}  # fmt: skip
    by_prompt: dict[int, list[list[int]]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt"], []).append(r["tokens"])
    equal = all(all(t == ts[0] for t in ts) for ts in by_prompt.values())
    return {**rates, "b_over_a_on": round(rates["B_on"] / rates["A_on"], 3),
            "b_over_a_off": round(rates["B_off"] / rates["A_off"], 3),
            "outputs_equal": equal}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    prompts = load_prompts(args.prompts, args.num_prompts)
    ports = dict(zip(STACKS, free_ports(2), strict=True))
    envs = {"A": args.env_a, "B": args.env_b}
    own_args = {"A": shlex.split(args.args_a), "B": shlex.split(args.args_b)}
    logs = Path(tempfile.mkdtemp(prefix="twin-stacks-"))
    processes: dict[str, subprocess.Popen] = {}
    clients: dict[str, Client] = {}
    rows: list[dict[str, Any]] = []
    rounds = []
    try:  # the stack started first is stopped too when the second fails to start
        for s in STACKS:
            flags = own_args[s] + args.serve_args
            processes[s] = start_stack(ports[s], envs[s], flags, logs / f"{s}.log")
        clients.update({s: Client(f"127.0.0.1:{ports[s]}") for s in STACKS})
        for r in range(args.rounds):
            rows += one_round(clients, prompts, args, r)
            rounds.append(summary(rows))  # cumulative over the rounds so far
            print(f"after round {r}: {rounds[-1]}", flush=True)
    finally:
        for client in clients.values():
            client.close()
        for process in processes.values():
            process.send_signal(signal.SIGINT)
        for process in processes.values():
            process.wait(60)
    return {"label": args.label, "benchmark": "twin_stacks", "when": utc_now(), "env_a": args.env_a,
            "env_b": args.env_b, "args_a": args.args_a, "args_b": args.args_b,
            "serve_args": args.serve_args, "switch": args.switch,
            "prompts": args.prompts, "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens, "rounds": rounds,
            "machine": machine_info(torch_threads=os.cpu_count() or 1),
            "versions": versions()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-a", nargs="*", default=[], help="NAME=VALUE for stack A")
    parser.add_argument("--env-b", nargs="*", default=[], help="NAME=VALUE for stack B")
    parser.add_argument("--args-a", default="", help='flags for stack A alone, one string '
                        '(e.g. "--draft-threads 1"), before --serve-args')
    parser.add_argument("--args-b", default="", help="flags for stack B alone")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                        help="the rest goes to both `splitspec serve`s (last)")
    parser.add_argument("--switch", action="store_true",
                        help="speculation on = the server's default (its switch) instead of forced")
    parser.add_argument("--prompts", default="sharegpt")
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", required=True, help="this run's key in --out")
    args = parser.parse_args(argv)
    save_run(args.out, args.label, run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
