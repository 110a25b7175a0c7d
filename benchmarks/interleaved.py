"""Arms run interleaved prompt by prompt through one stack (bench_logprobs.py,
bench_structured.py): the same batch-1 requests under a few settings, fairly compared."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from protos import generation_pb2 as pb
from splitspec.client import Client, GenerationResult
from splitspec.launcher import LocalStack

# one(ids, max_new, *arm) -> the arm's request for that prompt, streamed to its end
OneRequest = Callable[..., GenerationResult]


def bench_args(
    description: str, more: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """The interleaved benchmarks' flags, and ``more`` of a benchmark's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cpu", help="the target's and the drafter's device")
    p.add_argument("--dtype", default="float32", help="their dtype")
    p.add_argument("--prompts", type=int, default=12, help="short instructions to run")
    p.add_argument("--max-new-tokens", type=int, default=128, help="each reply's length at most")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    if more is not None:
        more(p)
    return p.parse_args()


def run_interleaved(
    prompts: list[list[int]], max_new: int, arms: dict[str, tuple], one: OneRequest
) -> dict[str, list[GenerationResult]]:
    """Every arm on every prompt, the arms' order turned one place a prompt, so that a box's
    drift hits them alike; results by arm name. First a short warm-up request of each arm,
    and every prompt into the radix cache with the first arm (else the first arm to meet a
    prompt would pay its prefill for the others)."""
    for arm in arms.values():
        one(prompts[0], 8, *arm)
    first = next(iter(arms.values()))
    for ids in prompts:
        one(ids, 1, *first)
    names = list(arms)
    results: dict[str, list[GenerationResult]] = {name: [] for name in names}
    for i, ids in enumerate(prompts):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            results[name].append(one(ids, max_new, *arms[name]))
    return results


def start(device: str, dtype: str, router_args: Sequence[str] = ()) -> LocalStack:
    model = ["--device", device, "--dtype", dtype]
    log_dir = Path(tempfile.mkdtemp(prefix="splitspec-bench-"))
    draft = [["--method", "eagle", *model]]
    stack = LocalStack(model, list(router_args), log_dir=log_dir, draft_args=draft)
    return stack.start(timeout_s=900)


def run_on_stack(
    args: argparse.Namespace,
    prompts: list[list[int]],
    arms: dict[str, tuple],
    one: OneRequest,
    router_args: Sequence[str] = (),
) -> tuple[dict[str, list[GenerationResult]], pb.ServerStatus]:
    """``run_interleaved`` on a stack of its own (router, target, one EAGLE replica on
    ``args.device``), stopped after; ``one(client, ids, max_new, *arm)``. Also the router's
    status after the run (its counters)."""
    stack = start(args.device, args.dtype, router_args)
    try:
        with Client(stack.router_address) as client:
            results = run_interleaved(prompts, args.max_new_tokens, arms, partial(one, client))
            return results, client.stub.GetServerStatus(pb.GetServerStatusRequest())
    finally:
        stack.stop()
