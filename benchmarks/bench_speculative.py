"""Speculative decoding through the live services on CPU: speed and acceptance, one run.

For each drafter setting (EAGLE tree, EAGLE chain, n-gram) a stack of real processes serves
the same prompts over the public API. Batch-1 tokens/s is measured side by side with
target-only decoding (the same stack, `speculation.enabled = false`; the modes alternate prompt
by prompt, and their outputs are checked equal); the mean acceptance length (committed tokens
per verify step, bonus included) is measured on held-out ShareGPT prompts and HumanEval
prompts, greedy. Prints a table and saves JSON (and a PNG of acceptance by tree shape).

    python -m benchmarks.bench_speculative            # full run (30-40 min on 2 cores)
    python -m benchmarks.bench_speculative --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.run_record import REPO_ROOT
from benchmarks.speculative_report import plot, print_table, write_report
from protos import generation_pb2 as pb
from splitspec.client import Client
from splitspec.launcher import LocalStack

DEFAULT_HEAD = REPO_ROOT / "draft_service" / "eagle" / "heads" / "smollm2-135m"


@dataclass(frozen=True)
class Setting:
    name: str
    method: str
    num_steps: int
    topk: int
    num_draft_tokens: int

    def draft_args(self, head: Path | None, threads: int) -> list[str]:
        args = [
            "--method",
            self.method,
            "--num-steps",
            str(self.num_steps),
            "--topk",
            str(self.topk),
            "--num-draft-tokens",
            str(self.num_draft_tokens),
        ]
        if self.method == "eagle" and head is not None:
            args += ["--eagle-head", str(head)]
        return args


MODES = ("speculative", "target_only")
SETTINGS = [
    Setting("eagle-tree", "eagle", 5, 4, 16),
    Setting("eagle-chain", "eagle", 4, 1, 5),
    Setting("ngram", "ngram", 5, 4, 16),
]


def sharegpt_heldout(count: int) -> list[str]:
    from draft_service.eagle.train.data import is_heldout, iter_conversations, split_key

    picked = []
    for conv in iter_conversations():
        if is_heldout(conv.conv_id) and len(conv.prompt) < 2000:
            picked.append(conv)
    picked.sort(key=lambda c: split_key(c.conv_id))
    return [c.prompt for c in picked[:count]]


def humaneval(count: int) -> list[str]:
    from draft_service.eagle.train.data import humaneval_prompts

    return [text for _, text in humaneval_prompts(count)]


def chat_request(
    prompt: str, max_new: int, speculate: bool, ignore_eos: bool
) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.messages.items.add(role="user", content=prompt)
    req.sampling.max_new_tokens = max_new
    req.sampling.temperature = 0.0
    req.sampling.ignore_eos = ignore_eos
    req.speculation.enabled = speculate
    return req


def final_item(
    client: Client, request: pb.GenerateRequest
) -> tuple[list[int], pb.GenerateResponse]:
    """Every token id of the stream, and its last item."""
    token_ids, final = [], None
    for item in client.stream(request, timeout_s=1800):
        token_ids += item.token_ids
        if item.finish_reason:
            final = item
    assert final is not None
    return token_ids, final


def batch1_speed(client: Client, prompts: list[str], max_new: int) -> dict[str, dict]:
    """Batch-1 tokens/s with and without speculation, interleaved prompt by prompt.

    The modes alternate which goes first, so a slow drift of the machine (other tenants, clock
    changes) falls on both equally instead of on whichever mode ran second.
    """
    totals = {mode: {"tokens": 0, "wall_s": 0.0, "steps": 0, "accepted": 0} for mode in MODES}
    mismatches = 0
    for i, prompt in enumerate(prompts):
        order = MODES if i % 2 == 0 else MODES[::-1]
        outputs = {}
        for mode in order:
            # Replies end where the model ends them (greedy speculation is lossless, so both
            # modes emit the same tokens); running past EOS would time text nobody asked for.
            request = chat_request(prompt, max_new, mode == "speculative", ignore_eos=False)
            started = time.perf_counter()
            outputs[mode], final = final_item(client, request)
            total = totals[mode]
            total["wall_s"] += time.perf_counter() - started
            total["tokens"] += len(outputs[mode])
            total["steps"] += final.speculation.verify_steps
            total["accepted"] += final.speculation.accepted_tokens
        mismatches += outputs["speculative"] != outputs["target_only"]
    summary = {mode: _speed_summary(t) for mode, t in totals.items()}
    summary["speculative"]["outputs_differing_from_target_only"] = mismatches
    return summary


def _speed_summary(total: dict) -> dict:
    steps = total["steps"]
    return {
        "tokens": total["tokens"],
        "wall_s": round(total["wall_s"], 2),
        "tok_s": round(total["tokens"] / total["wall_s"], 2),
        "mean_acceptance_length": round((total["accepted"] + steps) / steps, 3) if steps else None,
    }


def acceptance(client: Client, prompts: list[str], max_new: int, concurrency: int) -> dict:
    requests = [chat_request(p, max_new, True, ignore_eos=False) for p in prompts]
    with ThreadPoolExecutor(concurrency) as pool:
        finals = [f for _, f in pool.map(lambda r: final_item(client, r), requests)]
    steps = sum(f.speculation.verify_steps for f in finals)
    accepted = sum(f.speculation.accepted_tokens for f in finals)
    drafted = sum(f.speculation.draft_tokens for f in finals)
    return {
        "prompts": len(prompts),
        "verify_steps": steps,
        "accepted_tokens": accepted,
        "draft_tokens": drafted,
        "completion_tokens": sum(f.usage.completion_tokens for f in finals),
        "mean_acceptance_length": round((accepted + steps) / steps, 3) if steps else None,
    }


def run_setting(setting: Setting, args: argparse.Namespace, datasets: dict[str, list[str]]) -> dict:
    target_args = ["--threads", str(args.threads), "--dtype", args.dtype]
    target_args += shlex.split(args.target_args)
    log_dir = Path(tempfile.mkdtemp(prefix=f"splitspec-bench-{setting.name}-"))
    head = args.eagle_head if args.eagle_head and args.eagle_head.exists() else None
    draft_args = setting.draft_args(head, args.threads)
    draft_args += ["--dtype", args.draft_dtype, "--threads", str(args.draft_threads)]
    stack = LocalStack(target_args, [], log_dir=log_dir, draft_args=[draft_args])
    stack.start(timeout_s=900)
    try:
        with Client(stack.router_address) as client:
            final_item(client, chat_request("Warm up.", 8, True, ignore_eos=True))
            speed = batch1_speed(client, datasets["speed"], args.speed_tokens)
            out: dict[str, Any] = {
                "setting": setting.__dict__,
                "eagle_head": str(head) if head and setting.method == "eagle" else None,
                "hot_vocab": hot_vocab_size(head) if setting.method == "eagle" else None,
                "speculative_batch1": speed["speculative"],
                "target_only_batch1": speed["target_only"],
                "acceptance": {
                    name: acceptance(client, prompts, args.accept_tokens, args.concurrency)
                    for name, prompts in datasets.items()
                    if name != "speed"
                },
            }
    finally:
        stack.stop()
    s, t = out["speculative_batch1"], out["target_only_batch1"]
    out["speedup_batch1"] = round(s["tok_s"] / t["tok_s"], 3)
    return out


def hot_vocab_size(head: Path | None) -> int | None:
    """Tokens the head may draft (None: the whole vocabulary)."""
    path = head / "hot_vocab.safetensors" if head else None
    if path is None or not path.exists():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return int(f.get_slice("token_ids").get_shape()[0])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "benchmarks/results/speculative_cpu.json"
    )
    parser.add_argument(
        "--plot", type=Path, default=REPO_ROOT / "benchmarks/results/acceptance_by_shape.png"
    )
    parser.add_argument("--eagle-head", type=Path, default=DEFAULT_HEAD)
    parser.add_argument("--settings", default=",".join(s.name for s in SETTINGS))
    parser.add_argument("--num-sharegpt", type=int, default=100)
    parser.add_argument("--num-humaneval", type=int, default=50)
    # Acceptance grows along a reply (greedy replies of a small model repeat themselves), so
    # short replies understate it; 256 matches the offline replay of `splitspec eval-draft`.
    parser.add_argument("--accept-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-speed-prompts", type=int, default=10)
    parser.add_argument("--speed-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="target torch threads")
    parser.add_argument(
        "--draft-threads", type=int, default=0, help="draft torch threads (0: torch's default)"
    )
    parser.add_argument("--dtype", default="float32", help="target dtype (both modes)")
    parser.add_argument(
        "--target-args", default="", help="more target_service flags, e.g. '--no-prepack'"
    )
    parser.add_argument("--draft-dtype", default="auto", help="draft dtype")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.num_sharegpt, args.num_humaneval, args.accept_tokens = 3, 2, 12
        args.num_speed_prompts, args.speed_tokens = 1, 12
    return args


def load_datasets(args: argparse.Namespace) -> dict[str, list[str]]:
    """Acceptance's prompt sets, and "speed": the first held-out ShareGPT ones, for tok/s."""
    datasets = {
        "sharegpt_heldout": sharegpt_heldout(args.num_sharegpt),
        "humaneval": humaneval(args.num_humaneval),
    }
    datasets["speed"] = datasets["sharegpt_heldout"][: args.num_speed_prompts]
    return datasets


def main() -> None:
    args = parse_args()
    datasets = load_datasets(args)
    chosen = [s for s in SETTINGS if s.name in args.settings.split(",")]
    results = []
    for setting in chosen:
        print(f"== {setting.name}", flush=True)
        result = run_setting(setting, args, datasets)
        results.append(result)
        print(json.dumps(result, indent=1), flush=True)
    write_report(args, results)
    plot(results, args.plot)
    print_table(results)
    print(f"saved {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
