"""Where a speculative round's host time goes: py-spy samples of the router, the target and the
draft service while one stream at a time decodes with EAGLE (bf16, the default model), beside
the router's own round breakdown. py-spy is not a dependency: carry its wheel to the GPU box.

  python -m benchmarks.gpu_round_profile --prompts PROMPTS.json --out-dir DIR [--seconds 8]

Writes DIR/<service>.txt (py-spy's collapsed stacks: one line per stack, its sample count) and
DIR/round_profile.json (the round breakdown of the profiled steps; py-spy slows the services a
little, so take the figures from benchmarks/bench_gpu.py and the shares from here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
from pathlib import Path

from benchmarks.gpu_stack import chat_ids, stack, step_timing, throughput
from splitspec.client import Client


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "2000",
         "--format", "raw", "--output", str(out), "--nonblocking", "--threads"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    prompts = chat_ids(json.loads(args.prompts.read_text())["sharegpt_heldout"][:40])
    with stack("bfloat16", drafter=True, attention="paged") as s:
        client = Client(s.router_address)
        throughput(client, prompts[:2], 1, 16, True)  # warm-up
        services = {"router": s.router, "target": s.target, "draft": s.drafts[0]}
        spies = {name: profile(svc.started.pid, args.seconds, args.out_dir / f"{name}.txt")
                 for name, svc in services.items()}  # fmt: skip
        before = step_timing(client, kind="speculative")
        stop = threading.Event()

        def stop_when_spies_end() -> None:
            for spy in spies.values():
                spy.wait()
            stop.set()

        done = threading.Thread(target=stop_when_spies_end)
        done.start()
        runs = 0
        while not stop.is_set() and runs < len(prompts):
            throughput(client, prompts[runs : runs + 1], 1, 128, True)
            runs += 1
        done.join()
        report = {"streams": runs, "round_ms": step_timing(client, before, "speculative")}
        client.close()
    (args.out_dir / "round_profile.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
