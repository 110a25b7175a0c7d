"""`splitspec generate` (and `splitspec serve --demo`) against a real router: the stream and
its summary, and one line, not a traceback, for a refused request or a router that is not
there."""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitspec import cli, demo, serve_cli
from splitspec.launcher import LocalStack, free_ports
from tests.helpers.spec_fixtures import start_stack, tiny_model_dir_fixture  # noqa: F401

pytestmark = pytest.mark.timeout(180)


def generate(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "splitspec.cli", "generate", "--address", address, *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LocalStack]:
    started = start_stack(tmp_path_factory.mktemp("generate-cli"), tiny_model_dir)
    try:
        yield started
    finally:
        started.stop()


def test_generate_streams_a_reply_and_its_summary(stack: LocalStack) -> None:
    done = generate(stack.router_address, "Say hello.", "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "6 tokens in" in done.stdout and "finish length" in done.stdout, done.stdout


def test_a_refused_request_is_one_line_with_its_status(stack: LocalStack) -> None:
    done = generate(stack.router_address, "Say hello.", "--temperature", "-1")
    assert done.returncode == 1
    assert done.stderr.strip() == (  # the field: from the status's BadRequest
        "error: INVALID_ARGUMENT: temperature must be >= 0 (0 is greedy), got -1.0"
        " (field sampling.temperature)"
    )


def test_port_reaches_a_router_on_this_machine(stack: LocalStack) -> None:
    """`serve --port N` then `generate --port N`: the port alone, as serve's last line says."""
    port = stack.router_address.rpartition(":")[2]
    done = subprocess.run(
        [sys.executable, "-m", "splitspec.cli", "generate", "--port", port, "Say hello.",
         "--max-new-tokens", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 tokens in" in done.stdout, done.stdout


def test_port_and_address_together_are_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["generate", "--port", "1", "--address", "127.0.0.1:1", "hi"])
    assert stopped.value.code == 2
    assert "argument --address: not allowed with argument --port" in capsys.readouterr().err


def test_an_unknown_flag_is_refused_with_the_commands_usage(capsys: pytest.CaptureFixture) -> None:
    """Said by `generate`'s parser, with its usage (argparse's top level showed its own)."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["generate", "--bogus", "hi"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: splitspec generate")
    assert "splitspec generate: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize(
    ("address", "flag"),
    [("127.0.0.1:50051", ""), ("127.0.0.1:50071", " --port 50071"),
     ("0.0.0.0:50051", " --address 0.0.0.0:50051")],
)  # fmt: skip
def test_serve_names_the_generate_flag_for_its_router(address: str, flag: str) -> None:
    assert serve_cli._generate_flag(address) == flag


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--json-schema", "@{tmp}/none.json"], "error: --json-schema @{tmp}/none.json: cannot read"),
     (["--json-schema", "{{bad"], "error: --json-schema is not JSON: Expecting property name"),
     (["--grammar", "@{tmp}/g.lark"], "error: --grammar @{tmp}/g.lark: cannot read the file")],
)  # fmt: skip
def test_a_format_that_cannot_be_sent_is_a_usage_error(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Said before any connection (here none could be made): it was a traceback, or for a
    schema that is not JSON the router's refusal after a round trip."""
    argv = ["generate", "--address", "127.0.0.1:1", *[f.format(tmp=tmp_path) for f in flags], "hi"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.startswith(said.format(tmp=tmp_path))


def test_serve_names_splitspec_as_this_shell_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run` runs .venv/bin/splitspec, which a shell without the venv does not find."""
    script = tmp_path / "venv" / "bin" / "splitspec"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(script), "serve"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert serve_cli._own_command() == str(script)
    monkeypatch.setenv("PATH", str(script.parent))
    assert serve_cli._own_command() == "splitspec"
    monkeypatch.setattr(sys, "argv", ["/x/splitspec/cli.py", "serve"])  # python -m splitspec.cli
    assert serve_cli._own_command() == "splitspec"


def test_no_router_is_one_line_naming_the_address() -> None:
    (port,) = free_ports(1)  # nothing listens there once free_ports has closed it
    done = generate(f"127.0.0.1:{port}", "Say hello.")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: no router answers at 127.0.0.1:{port}")
    assert "splitspec serve" in lines[0]


@pytest.mark.parametrize(("prompt", "stdin"), [("hi \udcff", b""), ("-", b"hi \xff there")])
def test_a_prompt_that_is_not_utf8_is_one_line(
    prompt: str, stdin: bytes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Bytes that are not UTF-8 (in argv they arrive as lone surrogates) were protobuf's
    UnicodeEncodeError traceback while building the request; refused before any connection."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert cli.main(["generate", "--address", "127.0.0.1:1", prompt]) == 2
    assert capsys.readouterr().err.startswith("error: the prompt is not valid UTF-8 (at 3)")


@pytest.mark.parametrize(
    ("prompt", "stdin", "said"),
    [("", b"", "the prompt is empty"), (" \n\t", b"", "the prompt is empty"),
     ("-", b"", "the prompt read from stdin is empty"),
     ("-", b" \r\n\t ", "the prompt read from stdin is empty")],
)  # fmt: skip
def test_an_empty_prompt_is_a_usage_error(
    prompt: str, stdin: bytes, said: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """Sent before: a chat template around nothing was answered as a request (with --raw the
    router refused it); argv and stdin alike, refused before any connection now."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert cli.main(["generate", "--address", "127.0.0.1:1", prompt]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said} or only whitespace"), err


@pytest.mark.parametrize("flag", ["--stop", "--choice", "--regex", "--grammar", "--json-schema"])
def test_a_text_flag_that_is_not_utf8_is_a_usage_error(
    flag: str, capsys: pytest.CaptureFixture
) -> None:
    """As the prompt: protobuf's traceback before, a usage error naming the flag now."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "--address", "127.0.0.1:1", flag, "x \udcff", "hi"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: not valid UTF-8 (at 2)" in err and "Traceback" not in err


def test_a_target_address_is_one_line_saying_it_is_not_a_router(stack: LocalStack) -> None:
    done = generate(stack.target_address, "Say hello.")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {stack.target_address} is not a router"), lines[0]


def reply_of(done: subprocess.CompletedProcess) -> str:
    """The streamed text: stdout before the blank line and the summary."""
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.rsplit("\n\n", 1)[0]


def test_sampling_flags_and_stop_reach_the_request(stack: LocalStack) -> None:
    ask = [stack.router_address, "Say hello.", "--max-new-tokens", "12", "--raw"]
    text = reply_of(generate(*ask))
    # Sampling from the single likeliest token is greedy, whatever the temperature and seed.
    sampled = ["--temperature", "0.9", "--top-k", "1", "--top-p", "0.5", "--seed", "4"]
    assert reply_of(generate(*ask, *sampled)) == text
    stop = text.strip()[len(text.strip()) // 2 :][:3]
    assert stop.strip(), text  # a visible piece from the middle of the reply
    stopped = generate(*ask, "--stop", "never-there", "--stop", stop)
    assert "finish stop" in stopped.stdout, stopped.stdout
    assert stop not in reply_of(stopped) and text.startswith(reply_of(stopped))


def test_a_refused_demo_request_is_one_line(
    stack: LocalStack, capsys: pytest.CaptureFixture[str]
) -> None:
    """`splitspec serve --demo` with a prompt the router refuses (longer than the context): one
    line with the status, no traceback, and serve stops its stack (exit 1)."""
    args = argparse.Namespace(demo_prompt="sky " * 20000, demo_tokens=8)
    assert not demo.run_demo(stack.router_address, args, compare=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: the demo's request failed: INVALID_ARGUMENT: prompt has ")
    assert "the context holds" in lines[0]


def test_a_prompt_of_dash_is_read_from_stdin(stack: LocalStack) -> None:
    ask = ["--max-new-tokens", "6", "--raw"]
    piped = subprocess.run(
        [sys.executable, "-m", "splitspec.cli", "generate", "--address", stack.router_address,
         "-", *ask],
        input="Say hello.", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    direct = generate(stack.router_address, "Say hello.", *ask)
    assert reply_of(piped) == reply_of(direct)
    prompt_size = re.compile(r"\| prompt (\d+) ")  # the summary's prompt tokens: "-" is one
    assert prompt_size.findall(piped.stdout) == prompt_size.findall(direct.stdout) != ["1"]


def test_logprobs_print_a_line_per_token(stack: LocalStack) -> None:
    done = generate(stack.router_address, "Say hello.", "--max-new-tokens", "5", "--logprobs", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("token                 logprob")[1].strip().splitlines()[1:]
    assert len(table) == 5, done.stdout
    for line in table:  # the token, its logprob (<= 0), then two alternatives with theirs
        values = [float(v) for v in re.findall(r"(?<=\s)-?\d+\.\d{3}(?=\s|$)", line)]
        assert len(values) == 3 and all(v <= 0 for v in values), line
        assert values[0] == values[1], line  # greedy: the token is the likeliest


def test_prompt_logprobs_print_the_prompts_tokens_and_its_perplexity(stack: LocalStack) -> None:
    text = "The capital of France is"
    done = generate(stack.router_address, text, "--raw", "--max-new-tokens", "2",
                    "--prompt-logprobs")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    prompt_part = done.stdout.split("the prompt:")[1]
    table = prompt_part.split("log-likelihood")[0].strip().splitlines()[1:]
    prompt_tokens = int(re.findall(r"\| prompt (\d+) ", done.stdout)[0])
    assert len(table) == prompt_tokens - 1 >= 3, done.stdout
    values = [float(re.findall(r"(?<=\s)-?\d+\.\d{3}(?=\s|$)", line)[0]) for line in table]
    total, count, perplexity = re.findall(
        r"log-likelihood (-?\d+\.\d+) over (\d+) tokens, perplexity (\d+\.\d+)", done.stdout
    )[0]
    assert int(count) == len(table) and abs(float(total) - sum(values)) < 0.01
    assert math.isclose(float(perplexity), math.exp(-float(total) / len(table)), rel_tol=1e-3)


def test_format_flags_shape_the_reply(stack: LocalStack, tmp_path: Path) -> None:
    ask = [stack.router_address, "Pick one.", "--max-new-tokens", "24"]
    assert reply_of(generate(*ask, "--choice", "alpha", "--choice", "beta")) in ("alpha", "beta")
    assert re.fullmatch(r"[0-9]{3}", reply_of(generate(*ask, "--regex", "[0-9]{3}")))
    schema = tmp_path / "schema.json"
    # The tiny random model takes free whitespace forever: the schema turns it off.
    schema.write_text('{"type": "object", "properties": {"ok": {"type": "boolean"}}, '
                      '"required": ["ok"], "additionalProperties": false, '
                      '"x-guidance": {"whitespace_flexible": false}}')  # fmt: skip
    done = generate(*ask, "--json-schema", f"@{schema}")
    assert "finish eos" in done.stdout and set(json.loads(reply_of(done))) == {"ok"}
    refused = generate(*ask, "--regex", "((")
    assert refused.returncode == 1
    assert refused.stderr.strip().startswith("error: INVALID_ARGUMENT: structured_output.regex: ")
