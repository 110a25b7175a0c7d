"""The `splitspec` command: serve the whole stack, run one service, or generate."""

from __future__ import annotations

import argparse
import logging
import sys

import grpc

from plumbing.arg_types import int_between, utf8_text
from plumbing.flag_hints import HintingParser
from plumbing.omp_spin import shorten_idle_spin
from splitspec.bench import add_bench_parser
from splitspec.connection import add_connection_flags, connection_from_args
from splitspec.formats import add_format_flags
from splitspec.serve_cli import add_serve_parser
from splitspec.train_cli import add_train_parser

# The request fields' ranges (protos/generation.proto): past them protobuf raises ValueError.
UINT32_MAX, INT32_MAX, UINT64_MAX = (1 << 32) - 1, (1 << 31) - 1, (1 << 64) - 1


def _generate(args: argparse.Namespace) -> int:
    from splitspec.client import build_request, describe_rpc_error, print_generation
    from splitspec.formats import structured_output

    router = connection_from_args(args)

    speculate = None if args.speculate is None else args.speculate == "on"
    prompt = _checked_prompt(args.prompt)
    if prompt is None:
        return 2
    try:
        output_format = structured_output(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    request = build_request(
        prompt, not args.raw, args.max_new_tokens, args.temperature, args.seed, speculate,
        top_p=args.top_p, top_k=args.top_k, stop=args.stop, top_logprobs=args.logprobs,
        prompt_logprobs=args.prompt_logprobs, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, min_tokens=args.min_tokens,
        structured_output=output_format,
    )  # fmt: skip
    try:
        print_generation(router, request)
    except grpc.RpcError as err:
        print(f"\nerror: {describe_rpc_error(err, router)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the channel closed on the way out: the router aborts the request
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


def _checked_prompt(arg: str) -> str | None:
    """The prompt, or None after one line saying why it cannot be sent: a usage error (exit
    2), before any connection."""
    try:
        prompt = _read_prompt(arg)
    except (UnicodeDecodeError, UnicodeEncodeError) as err:
        print(f"error: the prompt is not valid UTF-8 (at {err.start}); the API takes UTF-8 "
              "text", file=sys.stderr)  # fmt: skip
        return None
    # Sent, it was a chat template around nothing (or, --raw, the router's INVALID_ARGUMENT).
    if not prompt.strip():
        where = "read from stdin " if arg == "-" else ""
        print(f"error: the prompt {where}is empty or only whitespace; give the text to "
              "complete", file=sys.stderr)  # fmt: skip
        return None
    return prompt


def _read_prompt(arg: str) -> str:
    """The prompt (``-``: stdin's) as text; UnicodeDecodeError or UnicodeEncodeError where it
    is not UTF-8, which protobuf would raise as a traceback while building the request."""
    if arg == "-":
        return sys.stdin.buffer.read().decode("utf-8")
    arg.encode("utf-8")  # argv's bytes that are not UTF-8 arrive as lone surrogates
    return arg


def _add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="stream a completion from a running router")
    p.add_argument("prompt", help="a chat message (or raw text with --raw), not empty; -: read it "
                   "from stdin")
    add_connection_flags(p)
    reply = p.add_argument_group("the reply")
    reply.add_argument("--max-new-tokens", type=int_between(1, UINT32_MAX), default=128,
                       help="the reply's length at most")
    reply.add_argument("--stop", action="append", default=[], metavar="TEXT", type=utf8_text,
                       help="end the reply before this text (repeatable)")
    reply.add_argument("--raw", action="store_true",
                       help="send the prompt as text, no chat template")
    reply.add_argument("--speculate", choices=["on", "off"], default=None,
                       help="this request's speculation (default: the router's choice)")
    reply.add_argument("--logprobs", type=int_between(0, UINT32_MAX), default=None,
                       metavar="N",
                       help="after the reply, each token's log-probability under the target "
                            "and the N (at most 20) likeliest tokens at its place")
    reply.add_argument("--prompt-logprobs", action="store_true",
                       help="also each prompt token's log-probability given the tokens before "
                            "it (with --logprobs N, the N likeliest too), and the prompt's "
                            "log-likelihood and perplexity")
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    sampling.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (1.0: off)")
    sampling.add_argument("--top-k", type=int_between(0, INT32_MAX), default=0,
                          help="sample from the k likeliest (0: off)")
    sampling.add_argument("--min-p", type=float, default=0.0,
                          help="drop tokens under this share of the likeliest's probability "
                               "(0: off)")
    sampling.add_argument("--repetition-penalty", type=float, default=1.0,
                          help="HF's, over the prompt and the reply, in (0, 2] (1: off)")
    sampling.add_argument("--min-tokens", type=int_between(0, UINT32_MAX), default=0,
                          help="no end of sequence, stop token or stop text before this many "
                               "tokens")
    sampling.add_argument("--seed", type=int_between(0, UINT64_MAX), default=None,
                          help="makes a sampled request reproducible")
    add_format_flags(p)
    p.set_defaults(func=_generate)


def _status(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from splitspec.client import Client, describe_rpc_error
    from splitspec.status_report import status_lines

    router = connection_from_args(args)
    try:
        with Client.connect(router) as client:
            status = client.status()
    except grpc.RpcError as err:
        print(f"error: {describe_rpc_error(err, router)}", file=sys.stderr)
        return 1
    if args.json:
        print(json_format.MessageToJson(status, always_print_fields_with_no_presence=True))
    else:
        print("\n".join(status_lines(router.address, status)))
    return 0 if not status.unavailable_reason else 3  # 3: up, but refusing requests


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="a running router's state: requests, KV slots, speculation, draft replicas (exit "
        "3 while it refuses requests)",
    )
    add_connection_flags(p)
    p.add_argument_group("output").add_argument(
        "--json", action="store_true", help="GetServerStatus's every field, as JSON"
    )
    p.set_defaults(func=_status)


SERVICES = ("router", "target", "draft")


def _add_service(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    # Listed for --help only: main hands everything after the name to the service's own parser
    # (argparse's REMAINDER would refuse a first argument like --help).
    sub.add_parser(name, help=help_text, add_help=False)


def _run_service(name: str, rest: list[str]) -> int:
    if name != "router":
        shorten_idle_spin(name)  # before the service's imports load torch
    if name == "target":
        from target_service.server import main as service_main
    elif name == "draft":
        from draft_service.server import main as service_main
    else:
        from router.server import main as service_main
    service_main(rest)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("splitspec")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SERVICES:
        return _run_service(argv[0], argv[1:])
    parser = HintingParser(prog="splitspec", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    _add_generate(sub)
    _add_status(sub)
    add_bench_parser(sub)
    add_train_parser(sub)
    _add_service(sub, "router", "run the router alone (see `splitspec router --help`)")
    _add_service(sub, "target", "run the target service alone (see `splitspec target --help`)")
    _add_service(sub, "draft", "run a draft service alone (see `splitspec draft --help`)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser.parse_args(argv)  # an unknown flag: said by its command, with a guess
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
