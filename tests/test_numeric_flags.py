"""Every service's numeric flags refuse values it cannot run with, as usage errors naming the
flag (before this, `router --max-running 0` started a router that never ran a request, and
`serve --demo-tokens 0` or `serve --num-steps 0` failed only after the services had started)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from draft_service import arguments as draft_arguments
from router import arguments as router_arguments
from splitspec import cli
from splitspec.serve_cli import add_serve_parser
from splitspec.train_cli import add_train_parser
from target_service import arguments as target_arguments


def serve_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="splitspec")
    sub = top.add_subparsers(dest="command")
    add_serve_parser(sub)
    return sub.choices["serve"]


def service_parser(add_arguments: Callable[[argparse.ArgumentParser], None]) -> Callable:
    def make() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return parser

    return make


def generate_parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="splitspec")
    sub = top.add_subparsers(dest="command")
    cli._add_generate(sub)
    return sub.choices["generate"]


def train_parser(command: str) -> Callable[[], argparse.ArgumentParser]:
    def make() -> argparse.ArgumentParser:
        top = argparse.ArgumentParser(prog="splitspec")
        sub = top.add_subparsers(dest="command")
        add_train_parser(sub)
        return sub.choices[command]

    return make


PARSERS = {
    "router": service_parser(router_arguments.add_arguments),
    "target": service_parser(target_arguments.add_arguments),
    "draft": service_parser(draft_arguments.add_arguments),
    "serve": serve_parser,
    "generate": generate_parser,
    "train-draft": train_parser("train-draft"),
    "eval-draft": train_parser("eval-draft"),
}
# Flags a command needs whatever else is given, so that the flag under test decides.
REQUIRED = {"train-draft": ["--out", "run"], "eval-draft": ["--out", "e.json", "--head", "h"]}


def parse(command: str, *argv: str) -> argparse.Namespace:
    return PARSERS[command]().parse_args([*REQUIRED.get(command, []), *argv])


@pytest.mark.parametrize(
    ("command", "flag", "value", "says"),
    [
        ("router", "--max-running", "0", "must be >= 1, got 0"),
        ("router", "--max-queue", "-3", "must be >= 1, got -3"),
        ("router", "--max-step-tokens", "1.5", "not an integer: '1.5'"),
        ("router", "--max-tree-tokens", "0", "must be >= 1, got 0"),
        ("router", "--rpc-timeout", "0", "must be > 0, got 0"),
        ("router", "--draft-timeout", "-1", "must be > 0, got -1"),
        ("router", "--target-wait-s", "nan", "not a number: 'nan'"),
        ("router", "--decode-steps", "-1", "must be >= 0, got -1"),
        ("router", "--port", "65536", "a port is 0-65535, got 65536"),
        ("router", "--target-claim-lease", "0.5", "must be at least 1 s (the claim is renewed"),
        ("router", "--target-claim-lease", "soon", "not a number: 'soon'"),
        ("target", "--num-slots", "0", "must be >= 1, got 0"),
        ("target", "--max-context", "-8", "must be >= 1, got -8"),
        ("target", "--threads", "-1", "must be >= 0, got -1"),
        ("target", "--decode-steps", "0", "must be >= 1, got 0"),
        ("draft", "--num-steps", "0", "must be >= 1, got 0"),
        ("draft", "--num-draft-tokens", "1", "must be >= 2, got 1"),
        ("draft", "--threads", "two", "not an integer: 'two'"),
        ("serve", "--num-draft-replicas", "-1", "must be >= 0, got -1"),
        ("serve", "--demo-tokens", "0", "must be >= 1, got 0"),
        ("serve", "--start-timeout", "0", "must be > 0, got 0"),
        ("serve", "--topk", "-2", "must be >= 1, got -2"),
        ("serve", "--num-slots", "0", "must be >= 1, got 0"),
        # A request field past its proto type was protobuf's ValueError, as a traceback.
        ("generate", "--max-new-tokens", "-1", "must be >= 1, got -1"),
        ("generate", "--max-new-tokens", "4294967296", "must be <= 4294967295, got 4294967296"),
        ("generate", "--seed", "-1", "must be >= 0, got -1"),
        ("generate", "--top-k", "2147483648", "must be <= 2147483647, got 2147483648"),
        ("generate", "--logprobs", "-1", "must be >= 0, got -1"),
        ("generate", "--min-tokens", "-1", "must be >= 0, got -1"),
        # train-draft and eval-draft took any int: --steps 0 trained nothing, and said so late.
        ("train-draft", "--steps", "0", "must be >= 1, got 0"),
        ("train-draft", "--batch-size", "0", "must be >= 1, got 0"),
        ("train-draft", "--lr", "-0.001", "must be > 0, got -0.001"),
        ("train-draft", "--eval-at", "100,x", "not an integer: 'x'"),
        ("train-draft", "--noise-std", "-0.1", "must be >= 0, got -0.1"),
        ("eval-draft", "--max-new-tokens", "0", "must be >= 1, got 0"),
        ("eval-draft", "--num-sharegpt", "-1", "must be >= 0, got -1"),
    ],
)
def test_a_value_out_of_range_is_a_usage_error_naming_the_flag(
    command: str, flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse(command, flag, value)
    assert stopped.value.code == 2
    assert f"error: argument {flag}: {says}" in capsys.readouterr().err


def test_router_values_in_range_parse_to_numbers() -> None:
    args = parse("router", "--max-running", "1", "--rpc-timeout", "0.5", "--decode-steps", "0",
                 "--port", "0", "--max-speculative-batch", "0",
                 "--target-claim-lease", "1")  # fmt: skip
    assert (args.max_running, args.rpc_timeout, args.decode_steps, args.port) == (1, 0.5, 0, 0)
    assert args.max_speculative_batch == 0 and args.target_claim_lease == 1.0
    assert parse("router").target_claim_lease == 5.0  # the default


def test_serve_values_in_range_parse_to_numbers() -> None:
    args = parse("serve", "--num-draft-replicas", "0", "--demo-tokens", "1", "--start-timeout",
                 "0.5", "--num-draft-tokens", "2", "--draft-threads", "0")  # fmt: skip
    assert (args.num_draft_replicas, args.demo_tokens, args.start_timeout) == (0, 1, 0.5)
    assert (args.num_draft_tokens, args.draft_threads) == (2, 0)
