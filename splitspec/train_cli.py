"""`splitspec train-draft` and `splitspec eval-draft`: train an EAGLE head for the target by
self-distillation, and measure a head's acceptance offline.

Wire into the main command with ``add_train_parser(subparsers)``; ``main(argv)`` runs alone
(``python -m splitspec.train_cli train-draft ...``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from plumbing.paths import default_cache_dir


def _train(args: argparse.Namespace) -> int:
    import torch

    from draft_service.eagle.train.collect import CollectConfig
    from draft_service.eagle.train.losses import LossWeights
    from draft_service.eagle.train.pipeline import PipelineConfig, run_pipeline
    from draft_service.eagle.train.train import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    on_gpu = args.device.startswith("cuda")
    if on_gpu:  # TF32 matmuls: the features differ from strict fp32 by ~1e-3, 5x faster
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    train = TrainConfig(
        steps=args.steps, batch_size=args.batch_size, max_seq_len=args.max_seq_len, lr=args.lr,
        warmup_steps=args.warmup_steps, grad_clip=args.grad_clip, num_unroll=args.num_unroll,
        ce_rows=args.ce_rows,
        weights=LossWeights(reg=args.reg_weight, cls=args.cls_weight,
                            step_decay=args.step_decay, soft_targets=not args.hard_targets),
        noise_std=args.noise_std, seed=args.seed, checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every, eval_at=tuple(args.eval_at), log_every=args.log_every,
        time_limit_s=args.time_limit,
        fit_steps_to_time=args.fit_steps_to_time, stop_at_step=args.stop_at_step,
        snapshot_at=tuple(args.snapshot_at))
    collect = CollectConfig(
        max_new_tokens=args.max_new_tokens, replies=args.replies,
        generate_batch_tokens=args.generate_batch_tokens or (1 << 18 if on_gpu else 1 << 14),
        feature_batch_tokens=args.feature_batch_tokens or (1 << 16 if on_gpu else 1 << 13),
        store_dtype=torch.bfloat16 if on_gpu else torch.float32, progress=not args.quiet)
    config = PipelineConfig(
        out=args.out, cache_dir=args.cache_dir or default_cache_dir(), model=args.model,
        device=args.device,
        prompts=args.prompts, num_prompts=args.num_prompts,
        num_eval_prompts=args.num_eval_prompts, num_humaneval=args.num_humaneval,
        max_prompt_len=args.max_prompt_len, collect=collect,
        eval_max_new_tokens=args.eval_max_new_tokens, data_dir=args.data_dir,
        save_data=args.save_data, resume=args.resume, train_until_s=args.train_until,
        train=train, progress=not args.quiet)
    report = run_pipeline(config)
    print(f"head: {args.out / 'head'}  steps {report['steps']}  loss {report['loss_first']} -> "
          f"{report['loss_last']}  eval {report['final_eval']}")
    return 0


def _write_prompts(args: argparse.Namespace) -> int:
    from draft_service.eagle.train.data import ChatTokenizer, prepare_prompts, save_bundle
    from model_runtime.loading import default_model_path, find_gguf

    tokenizer = ChatTokenizer(find_gguf(args.model or default_model_path()))
    sets = prepare_prompts(tokenizer, args.num_prompts, args.num_eval_prompts,
                           args.num_humaneval, args.max_prompt_len, args.with_replies)
    if args.all_turns:
        sets["train"] = _more_train_prompts(tokenizer, args)
    save_bundle(sets, args.out)
    print(" ".join(f"{k}={len(v)}" for k, v in sets.items()), f"-> {args.out}")
    return 0


def _more_train_prompts(tokenizer: object, args: argparse.Namespace) -> object:
    """Every user turn with its history, then code-completion prompts (ShareGPT's Python
    functions and, with --stdlib-code, the standard library's)."""
    import sysconfig

    from draft_service.eagle.train.more_prompts import concat, extra_train_prompts

    root = Path(sysconfig.get_paths()["stdlib"]) if args.stdlib_code else None
    extra = extra_train_prompts(tokenizer, args.max_prompt_len, args.max_turn_prompt_len, root)
    train = concat([extra["turns"], extra["code"]])
    return train.head(args.num_prompts) if args.num_prompts is not None else train


def _eval(args: argparse.Namespace) -> int:
    import json

    import torch

    from draft_service.eagle.train.pipeline import EvalConfig, run_eval

    if args.threads:
        torch.set_num_threads(args.threads)
    report = run_eval(EvalConfig(
        head=args.head, out_json=args.out, cache_dir=args.cache_dir or default_cache_dir(),
        model=args.model,
        device=args.device, prompts=args.prompts, num_sharegpt=args.num_sharegpt,
        num_humaneval=args.num_humaneval, max_prompt_len=args.max_prompt_len,
        max_new_tokens=args.max_new_tokens, data_dir=args.data_dir, progress=not args.quiet))
    summary = {s: {shape: r["mean_acceptance_length"] for shape, r in by_shape.items()}
               for s, by_shape in report["acceptance"].items()}
    print(json.dumps(summary))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None, help="target GGUF or checkpoint dir")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="converted-checkpoint cache (default: $SPLITSPEC_CACHE, else "
                        "~/.cache/splitspec)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--prompts", type=Path, default=None,
                   help="prompt bundle from `train-draft --write-prompts` (no data wheels needed)")
    p.add_argument("--max-prompt-len", type=int, default=512, help="longer prompts are skipped")
    p.add_argument("--num-humaneval", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-draft", help="train an EAGLE draft head (self-distillation)")
    _common(p)
    p.add_argument("--out", type=Path, required=True, help="run folder; the head goes to OUT/head")
    p.add_argument("--num-prompts", type=int, default=32, help="training prompts")
    p.add_argument("--num-eval-prompts", type=int, default=8, help="held-out ShareGPT prompts")
    p.add_argument("--max-new-tokens", type=int, default=96, help="reply length for training")
    p.add_argument("--eval-max-new-tokens", type=int, default=96)
    reply = p.add_mutually_exclusive_group()
    reply.add_argument("--self-distill", dest="replies", action="store_const", const="self",
                       help="train on the target's own greedy replies (default)")
    reply.add_argument("--sharegpt-replies", dest="replies", action="store_const",
                       const="sharegpt", help="train on ShareGPT's recorded replies")
    p.set_defaults(replies="self")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--num-unroll", type=int, default=3, help="training-time-test draft steps")
    p.add_argument("--ce-rows", type=int, default=0,
                   help="rows per draft step for the cross-entropy (0: all; GPU: e.g. 8192)")
    p.add_argument("--reg-weight", type=float, default=1.0)
    p.add_argument("--cls-weight", type=float, default=0.1)
    p.add_argument("--step-decay", type=float, default=0.8)
    p.add_argument("--hard-targets", action="store_true", help="CE on the greedy token only")
    p.add_argument("--noise-std", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-at", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="comma-separated steps to evaluate at (besides the end)")
    p.add_argument("--snapshot-at", type=lambda s: [int(x) for x in s.split(",") if x],
                   default=[], help="comma-separated steps whose weights are kept (bf16)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=0.0, help="seconds of training at most")
    p.add_argument("--train-until", type=float, default=0.0,
                   help="training stops this many seconds after the command started")
    p.add_argument("--fit-steps-to-time", action="store_true",
                   help="shrink --steps after 150 steps so the schedule ends within the time limit")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="stop at this step, keeping the --steps schedule (comparisons)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints")
    p.add_argument("--data-dir", type=Path, default=None, help="load collected data")
    p.add_argument("--save-data", type=Path, default=None, help="save collected data (shards)")
    p.add_argument("--generate-batch-tokens", type=int, default=0)
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls on the GPU (features)")
    p.add_argument("--feature-batch-tokens", type=int, default=0)
    p.set_defaults(func=_train)

    w = sub.add_parser("train-draft-prompts",
                       help="write a prompt bundle for train-draft --prompts")
    w.add_argument("--model", type=Path, default=None)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--num-prompts", type=int, default=None, help="default: every training prompt")
    w.add_argument("--num-eval-prompts", type=int, default=100)
    w.add_argument("--num-humaneval", type=int, default=50)
    w.add_argument("--max-prompt-len", type=int, default=512)
    w.add_argument("--with-replies", action="store_true", help="keep ShareGPT's replies too")
    w.add_argument("--all-turns", action="store_true",
                   help="train on every user turn (with its history) and on code-completion "
                        "prompts from the conversations' Python functions")
    w.add_argument("--max-turn-prompt-len", type=int, default=768,
                   help="with --all-turns: longest prompt with history")
    w.add_argument("--stdlib-code", action="store_true",
                   help="with --all-turns: code prompts from the standard library's functions too")
    w.set_defaults(func=_write_prompts)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval-draft", help="offline acceptance of a head (chain and tree)")
    _common(p)
    p.add_argument("--head", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="JSON report")
    p.add_argument("--num-sharegpt", type=int, default=100)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--data-dir", type=Path, default=None,
                   help="cache of the replays (target replies + rows): reused when present")
    p.set_defaults(func=_eval, num_humaneval=50)


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Adds train-draft, train-draft-prompts and eval-draft to a `splitspec` subparser set."""
    _add_train(sub)
    _add_eval(sub)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="splitspec", description=__doc__)
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
