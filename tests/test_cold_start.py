"""Cold starts on an empty cache, as a new user meets them (real processes, real model).

The first test is also the README's `splitspec serve --demo` end to end (what a user sees).

Each test gets an empty cache folder of its own, so the model is converted (and, where the CPU
can run it, the few-row kernel built) from nothing: the work that once raced when a stack's
target and drafter both found no converted checkpoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernels import few_row_linear
from splitspec.client import build_request
from splitspec.launcher import LocalStack
from tests.conftest import CPU_FP32
from tests.helpers.mounts import tmpfs
from tests.helpers.rpc import Router

pytestmark = pytest.mark.slow

SERVE_TIMEOUT_S = 600
KERNEL_BUILDS = few_row_linear.unavailable_reason() is None
EAGLE = ["--method", "eagle", "--device", "cpu", "--threads", "1"]


def splitspec_command() -> list[str]:
    """The `splitspec` script of the venv that runs the tests (what `make run` runs)."""
    script = Path(sys.executable).with_name("splitspec")
    return [str(script)] if script.exists() else [sys.executable, "-m", "splitspec.cli"]


def serve_demo(cache: Path, timeout_s: float = SERVE_TIMEOUT_S) -> subprocess.CompletedProcess:
    command = [*splitspec_command(), "serve", "--demo", "--exit-after-demo", "--demo-tokens", "24"]
    env = {**os.environ, "SPLITSPEC_CACHE": str(cache)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)


def leftovers(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if ".tmp" in p.name]


def test_make_run_command_streams_the_demo_on_an_empty_cache(tmp_path: Path) -> None:
    done = serve_demo(tmp_path / "cache")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "model: converting" in out and "done in" in out
    if KERNEL_BUILDS:
        assert "kernel: building the few-row linear kernel" in out
    demo = out.split("demo: ", 1)[1].splitlines()
    generated = "\n".join(demo[1:-1]).strip()
    stats = demo[-1]
    assert generated, out  # the demo streamed text
    assert "24 tokens" in stats and "tok/s" in stats and "acceptance" in stats, stats
    assert leftovers(tmp_path / "cache") == []
    # What a user sees (once test_e2e_serve_demo.py, the same command on a warm cache): the
    # EAGLE draft by default, speed and acceptance figures, and no service outliving it.
    assert "draft  (internal, splitspec.draft.v1.DraftModel, eagle)" in out
    speed = re.search(r"(\d+) tokens in [\d.]+ s = ([\d.]+) tok/s", stats)
    assert speed and int(speed.group(1)) == 24 and float(speed.group(2)) > 0, stats
    acceptance = re.search(r"acceptance ([\d.]+) tokens/step", stats)
    assert acceptance and float(acceptance.group(1)) >= 1.0, stats
    ports = re.findall(r"^(?:router|target|draft) .*: 127\.0\.0\.1:(\d+)$", out, re.MULTILINE)
    assert len(ports) == 3, out  # router, target, draft
    assert not [p for p in ports if services_on(p)], "a service outlived splitspec serve"


def services_on(port: str) -> list[str]:
    """Command lines of live processes started with --port PORT."""
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if f"--port {port}" in line]


def start_stack(cache: Path, log_dir: Path) -> LocalStack:
    cache_arg = ["--cache-dir", str(cache)]
    log_dir.mkdir()
    return LocalStack(
        [*CPU_FP32, *cache_arg], [], log_dir=log_dir, draft_args=[[*EAGLE, *cache_arg]]
    )


def test_two_stacks_starting_at_once_share_one_empty_cache(tmp_path: Path) -> None:
    """Two targets and two EAGLE drafters find no converted model at the same moment."""
    cache = tmp_path / "cache"
    stacks = [start_stack(cache, tmp_path / f"logs{i}") for i in range(2)]
    try:
        for stack in stacks:  # all four model services spawn before any is waited for
            stack.launch()
        for stack in stacks:
            stack.wait_ready(SERVE_TIMEOUT_S)
        request = build_request("Name three colours.", True, 16, 0.0)
        outputs = []
        for stack in stacks:
            router = Router(stack.router_address)
            outputs.append(router.generate(request).token_ids)
            router.close()
        assert len(outputs[0]) == 16 and outputs[0] == outputs[1]
    finally:
        for stack in stacks:
            stack.stop()
    logs = "".join(p.read_text() for p in tmp_path.glob("logs*/*.log"))
    assert logs.count("converting SmolLM2-135M-Instruct.Q4_1.gguf: done in") == 1, logs
    if KERNEL_BUILDS:
        assert logs.count("building the few-row kernel: done in") == 1
    assert leftovers(cache) == []


def test_a_conversion_killed_half_way_then_a_start_that_succeeds(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    convert = (
        "from model_runtime.loading import default_model_path, resolve_checkpoint; "
        f"resolve_checkpoint(default_model_path(), __import__('pathlib').Path({str(cache)!r}))"
    )
    victim = subprocess.Popen([sys.executable, "-c", convert])
    deadline = time.monotonic() + 120
    while not list(cache.glob(".*.tmp-*")):
        assert victim.poll() is None and time.monotonic() < deadline, "no conversion started"
        time.sleep(0.1)
    time.sleep(2.0)  # well into the conversion, which takes ~15 s
    victim.kill()
    victim.wait(10)
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == []
    stack = LocalStack(
        [*CPU_FP32, "--cache-dir", str(cache), "--no-few-row-kernel"], [], log_dir=tmp_path
    )
    with stack:
        router = Router(stack.router_address)
        stream = router.generate(build_request("Say hi.", True, 8, 0.0))
        router.close()
    assert len(stream.token_ids) == 8
    assert "left by a build that did not finish" in (tmp_path / "target.log").read_text()
    assert leftovers(cache) == []


def assert_clear_cache_error(done: subprocess.CompletedProcess, folder: Path, why: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert f"cannot write the cache folder {folder}" in errors[0]
    assert "SPLITSPEC_CACHE" in errors[0] and why in errors[0]


def test_a_read_only_cache_gives_one_clear_error(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as folder:
        cache = folder / "splitspec"
        assert_clear_cache_error(serve_demo(cache, 120), cache, "Read-only file system")
        target = LocalStack([*CPU_FP32, "--cache-dir", str(cache)], [], log_dir=tmp_path)
        with pytest.raises(RuntimeError, match="target exited with code 2") as caught:
            target.start(timeout_s=120)
        assert "cannot write the cache folder" in str(caught.value)
        assert "Traceback" not in (tmp_path / "target.log").read_text()


def test_a_full_cache_disk_gives_one_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", size="64m") as cache:  # the converted model needs ~540 MB
        assert_clear_cache_error(serve_demo(cache, 300), cache, "No space left on device")
        assert leftovers(cache) == []
