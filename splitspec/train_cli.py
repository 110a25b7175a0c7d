"""`splitspec train-draft` and `splitspec eval-draft`: train an EAGLE head for the target by
self-distillation, and measure a head's acceptance offline.

Wire into the main command with ``add_train_parser(subparsers)``; ``main(argv)`` runs alone
(``python -m splitspec.train_cli train-draft ...``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from plumbing.errors import StartupRefused
from plumbing.flag_hints import HintingParser
from plumbing.paths import default_cache_dir
from splitspec import train_flags

if TYPE_CHECKING:  # the torch side loads only when a command runs
    from draft_service.eagle.train.collect import CollectConfig
    from draft_service.eagle.train.data import ChatTokenizer, PromptSet
    from draft_service.eagle.train.train import TrainConfig


def _train(args: argparse.Namespace) -> int:
    import torch

    from draft_service.eagle.train.pipeline import PipelineConfig, run_pipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    on_gpu = args.device.startswith("cuda")
    if on_gpu:  # TF32 matmuls: the features differ from strict fp32 by ~1e-3, 5x faster
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    config = PipelineConfig(
        out=args.out, cache_dir=args.cache_dir or default_cache_dir(), model=args.model,
        device=args.device,
        prompts=args.prompts, num_prompts=args.num_prompts,
        num_eval_prompts=args.num_eval_prompts, num_humaneval=args.num_humaneval,
        max_prompt_len=args.max_prompt_len, collect=_collect_config(args, on_gpu),
        eval_max_new_tokens=args.eval_max_new_tokens, data_dir=args.data_dir,
        save_data=args.save_data, resume=args.resume, train_until_s=args.train_until,
        train=_train_config(args), progress=not args.quiet)
    report = run_pipeline(config)
    print(f"head: {args.out / 'head'}  steps {report['steps']}  loss {report['loss_first']} -> "
          f"{report['loss_last']}  eval {report['final_eval']}")
    return 0


def _train_config(args: argparse.Namespace) -> TrainConfig:
    from draft_service.eagle.train.losses import LossWeights
    from draft_service.eagle.train.train import TrainConfig

    return TrainConfig(
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


def _collect_config(args: argparse.Namespace, on_gpu: bool) -> CollectConfig:
    """Generation and feature batches sized for the device; bf16 features on the GPU."""
    import torch

    from draft_service.eagle.train.collect import CollectConfig

    return CollectConfig(
        max_new_tokens=args.max_new_tokens, replies=args.replies,
        generate_batch_tokens=args.generate_batch_tokens or (1 << 18 if on_gpu else 1 << 14),
        feature_batch_tokens=args.feature_batch_tokens or (1 << 16 if on_gpu else 1 << 13),
        store_dtype=torch.bfloat16 if on_gpu else torch.float32, progress=not args.quiet)


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


def _more_train_prompts(tokenizer: ChatTokenizer, args: argparse.Namespace) -> PromptSet:
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


Command = Callable[[argparse.Namespace], int]


def _refusing(command: Command, inputs: tuple[str, ...]) -> Command:
    """``command`` with what stops it as given said in one line, exit status 2, as the services
    say it: an input flag (``inputs``) naming nothing, and the refusals found on the way (a
    --model or --head that is not one, a cache folder it cannot write)."""

    def run(args: argparse.Namespace) -> int:
        for name in inputs:
            path = getattr(args, name)
            if path is not None and not path.exists():
                flag = "--" + name.replace("_", "-")
                print(f"error: {flag} {path}: no such file or folder", file=sys.stderr)
                return 2
        try:
            return command(args)
        except StartupRefused as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    return run


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """Adds train-draft, train-draft-prompts and eval-draft to a `splitspec` subparser set."""
    train = sub.add_parser("train-draft", help="train an EAGLE draft head (self-distillation)")
    train_flags.add_train_draft_flags(train)
    train.set_defaults(func=_refusing(_train, ("prompts", "data_dir")))
    bundle = sub.add_parser("train-draft-prompts",
                            help="write a prompt bundle for train-draft --prompts")
    train_flags.add_prompt_bundle_flags(bundle)
    bundle.set_defaults(func=_refusing(_write_prompts, ()))
    evaluate = sub.add_parser("eval-draft", help="offline acceptance of a head (chain and tree)")
    train_flags.add_eval_draft_flags(evaluate)
    evaluate.set_defaults(func=_refusing(_eval, ("head", "prompts")))


def main(argv: list[str] | None = None) -> int:
    parser = HintingParser(prog="splitspec", description=__doc__)
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
