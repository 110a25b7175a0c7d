"""The router's numeric flags refuse values it cannot run with, as usage errors naming the flag
(before this, --max-running 0 started a router that never ran a request)."""

from __future__ import annotations

import argparse

import pytest

from router.arguments import add_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="splitspec router")
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--max-running", "0", "must be >= 1, got 0"),
        ("--max-queue", "-3", "must be >= 1, got -3"),
        ("--max-step-tokens", "1.5", "not an integer: '1.5'"),
        ("--max-tree-tokens", "0", "must be >= 1, got 0"),
        ("--rpc-timeout", "0", "must be > 0, got 0"),
        ("--draft-timeout", "-1", "must be > 0, got -1"),
        ("--target-wait-s", "nan", "not a number: 'nan'"),
        ("--decode-steps", "-1", "must be >= 0, got -1"),
        ("--port", "65536", "a port is 0-65535, got 65536"),
    ],
)
def test_a_value_out_of_range_is_a_usage_error_naming_the_flag(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse(flag, value)
    assert stopped.value.code == 2
    assert f"error: argument {flag}: {says}" in capsys.readouterr().err


def test_values_in_range_parse_to_numbers() -> None:
    args = parse("--max-running", "1", "--rpc-timeout", "0.5", "--decode-steps", "0",
                 "--port", "0", "--max-speculative-batch", "0")  # fmt: skip
    assert (args.max_running, args.rpc_timeout, args.decode_steps, args.port) == (1, 0.5, 0, 0)
    assert args.max_speculative_batch == 0
