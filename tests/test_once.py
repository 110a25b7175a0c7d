"""plumbing/once.py: first-start work done once across real processes, safe to kill."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from plumbing.once import CacheWriteError, build_once, ensure_writable
from tests.helpers.mounts import tmpfs

# A builder process: build_once(final) with a build that records its pid, writes a part,
# sleeps (so that others pile up behind the lock, or a test can kill it), then finishes.
BUILDER = textwrap.dedent(
    """
    import logging, os, sys, time
    from pathlib import Path
    from plumbing.once import build_once
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    final, builds, sleep_s = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    def build(tmp):
        with open(builds, "a") as f:
            f.write(f"{os.getpid()}\\n")
        (tmp / "part1").write_text("half")
        time.sleep(sleep_s)
        (tmp / "part2").write_text(str(os.getpid()))
    build_once(final, build, "test build")
    print("result", (final / "part2").read_text(), flush=True)
    """
)


def start_builder(final: Path, builds: Path, sleep_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(final), str(builds), str(sleep_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if ".tmp" in p.name)


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_concurrent_processes_build_once_and_all_read_the_result(tmp_path: Path) -> None:
    final, builds = tmp_path / "cache" / "thing", tmp_path / "builds"
    procs = [start_builder(final, builds, 1.5) for _ in range(4)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    builders = builds.read_text().split()
    assert len(builders) == 1, f"built {len(builders)} times"
    results = {line for out in outputs for line in out.splitlines() if line.startswith("result")}
    assert results == {f"result {builders[0]}"}  # everyone read the one published result
    waiting = [out for out in outputs if "waiting for" in out]
    assert len(waiting) == 3, outputs  # the three that waited said so, naming the holder
    assert sorted(p.name for p in final.iterdir()) == ["part1", "part2"]
    assert leftovers(final.parent) == []


def test_a_killed_build_leaves_nothing_final_and_its_lock_is_taken_over(tmp_path: Path) -> None:
    final, builds = tmp_path / "thing", tmp_path / "builds"
    victim = start_builder(final, builds, 60.0)
    wait_for(lambda: any((p / "part1").exists() for p in tmp_path.glob(".thing.tmp-*")))
    victim.send_signal(signal.SIGKILL)  # dies holding the lock, half-way through
    victim.wait(10)
    assert not final.exists() and len(leftovers(tmp_path)) == 1
    started = time.monotonic()
    survivor = start_builder(final, builds, 0.0)
    out = survivor.communicate(timeout=60)[0]
    assert survivor.returncode == 0, out
    assert time.monotonic() - started < 20  # taken over at once, not after a stale timeout
    assert f"result {survivor.pid}" in out and "left by a build that did not finish" in out
    assert leftovers(tmp_path) == []


def test_a_failed_build_publishes_nothing(tmp_path: Path) -> None:
    final = tmp_path / "thing"

    def broken(tmp: Path) -> None:
        (tmp / "part1").write_text("half")
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        build_once(final, broken, "test build")
    assert not final.exists() and leftovers(tmp_path) == []
    assert build_once(final, lambda tmp: (tmp / "ok").write_text("1"), "retry") == final


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        # How safetensors' Rust writer reports a full disk: text only, no errno.
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ],
)
def test_a_full_disk_during_the_build_names_the_folder(tmp_path: Path, error: Exception) -> None:
    def fills_up(tmp: Path) -> None:
        raise error

    with pytest.raises(CacheWriteError) as caught:
        build_once(tmp_path / "thing", fills_up, "test build")
    message = str(caught.value)
    assert str(tmp_path) in message and "SPLITSPEC_CACHE" in message
    assert "No space left on device" in message
    assert leftovers(tmp_path) == []


def test_a_read_only_cache_folder_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", read_only=True) as folder:
        with pytest.raises(CacheWriteError) as caught:
            ensure_writable(folder / "cache")
        assert "Read-only file system" in str(caught.value)
        assert str(folder / "cache") in str(caught.value)
        with pytest.raises(CacheWriteError):
            build_once(folder / "thing", lambda tmp: None, "test build")


def test_a_cache_path_through_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(CacheWriteError, match="SPLITSPEC_CACHE"):
        ensure_writable(tmp_path / "file" / "cache")
