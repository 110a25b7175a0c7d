"""A mistyped flag is refused with the flag meant (plumbing/flag_hints.py): by the subcommand it
followed, in `splitspec`'s commands, in the services' own command lines and in serve's
--target-args."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from plumbing.flag_hints import HintingParser, closest_flag, unrecognized
from splitspec import cli
from splitspec.service_args import service_args

REPO_ROOT = Path(__file__).resolve().parent.parent


def _parsers() -> tuple[HintingParser, argparse.ArgumentParser]:
    """A command line with a `run` subcommand; the whole and `run`'s own."""
    parser = HintingParser(prog="tool")
    parser.add_argument("--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run")
    run.add_argument("--max-new-tokens", type=int, default=16)
    run.add_argument("--port", type=int)
    return parser, run


def test_the_closest_long_flag_is_named_and_a_far_one_is_not() -> None:
    run = _parsers()[1]
    assert closest_flag(run, "--max-tokens") == "--max-new-tokens"
    assert closest_flag(run, "--prot") == "--port"
    assert closest_flag(run, "--temperature") is None
    assert unrecognized(run, ["--max-tokens=5", "x", "--prot"]) == (
        "unrecognized arguments: --max-tokens=5 x --prot; --max-tokens: did you mean "
        "--max-new-tokens?; --prot: did you mean --port?"
    )


def test_known_flags_parse_as_argparse_would() -> None:
    args = _parsers()[0].parse_args(["--verbose", "run", "--max-new-tokens", "3"])
    assert (args.verbose, args.command, args.max_new_tokens, args.port) == (True, "run", 3, None)


def test_a_subcommands_typo_is_refused_by_the_subcommand(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        _parsers()[0].parse_args(["run", "--max-tokens", "5"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tool run")
    assert err.rstrip().endswith(
        "tool run: error: unrecognized arguments: --max-tokens 5; --max-tokens: did you mean "
        "--max-new-tokens?"
    )


def test_a_shortened_flag_is_refused_with_the_whole_one(capsys: pytest.CaptureFixture) -> None:
    """argparse would read --max-new as --max-new-tokens: a script's line that works until a
    second flag starts the same way."""
    with pytest.raises(SystemExit) as stopped:
        _parsers()[0].parse_args(["run", "--max-new", "5"])
    assert stopped.value.code == 2
    assert "--max-new: did you mean --max-new-tokens?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate", "hi", "--max-new", "5"])
    assert "--max-new: did you mean --max-new-tokens?" in capsys.readouterr().err


def test_generate_names_the_flag_meant(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["generate", "hi", "--max-tokens", "5"])
    assert stopped.value.code == 2
    assert "--max-tokens: did you mean --max-new-tokens?" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["generate", "hi"], ["status"], ["bench"]])
def test_a_router_flag_by_another_tools_name_is_answered_with_address(
    command: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit):
        cli.main([*command, "--router", "127.0.0.1:1"])
    assert "--router: did you mean --address?" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("service", "typo", "meant"),
    [("router", "--max-qeue", "--max-queue"), ("draft", "--metod", "--method"),
     ("target", "--atention", "--attention")],
)  # fmt: skip
def test_each_service_names_the_flag_meant(service: str, typo: str, meant: str) -> None:
    """Refused at parsing, before a service loads a model or binds a port."""
    done = subprocess.run([sys.executable, "-m", "splitspec.cli", service, typo, "1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"splitspec {service}: error: unrecognized arguments: {typo} 1" in done.stderr
    assert f"{typo}: did you mean {meant}?" in done.stderr


def test_serves_service_flags_name_the_flag_meant() -> None:
    with pytest.raises(ValueError, match="--atention: did you mean --attention"):
        service_args("target", "--atention torch")
