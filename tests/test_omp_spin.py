"""The services' OpenMP spin count (plumbing/omp_spin.py) is in the environment when torch loads.

libgomp reads GOMP_SPINCOUNT once, as torch loads it, so each check starts a service's real
entry point in a fresh interpreter whose import hook notes the variable at torch's first import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Notes GOMP_SPINCOUNT when torch is first imported, then runs the entry point with --help.
PROBE = """
import importlib.abc, os, runpy, sys

class NoteTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":
            print("at torch:", os.environ.get("GOMP_SPINCOUNT"), flush=True)
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, NoteTorch())
entry = sys.argv[1:]
sys.argv = [entry[0], "--help"]
if entry[0] == "cli":
    from splitspec.cli import main
    main([entry[1], "--help"])
else:
    runpy.run_module(entry[0], run_name="__main__")
"""


def run_probe(code: str, args: list[str], env: dict[str, str]) -> str:
    """``code`` in a fresh interpreter without the OpenMP settings of this process (conftest.py
    sets a wait policy) but with ``env``; its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env={**clean, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def spin_at_torch_import(args: list[str], **env: str) -> str:
    out = run_probe(PROBE, args, env)
    noted = [line for line in out.splitlines() if line.startswith("at torch:")]
    assert noted, f"torch was never imported: {out[-500:]}"
    return noted[0].removeprefix("at torch: ")


@pytest.mark.parametrize(
    "args, spins",
    [
        (["target_service"], "200000"),
        (["draft_service"], "100000"),
        (["cli", "target"], "200000"),
        (["cli", "draft"], "100000"),
    ],
)
def test_each_service_shortens_the_spin_before_torch_loads(args: list[str], spins: str) -> None:
    assert spin_at_torch_import(args) == spins


def test_the_users_own_setting_wins() -> None:
    assert spin_at_torch_import(["target_service"], GOMP_SPINCOUNT="1234") == "1234"
    assert spin_at_torch_import(["draft_service"], OMP_WAIT_POLICY="PASSIVE") == "None"


# A service's start as far as OpenMP goes: its spin, torch, two threads, one parallel region
# (an add over a million floats), then the release; prints the process's thread counts.
RELEASE_PROBE = """
import os, sys, time
from plumbing import omp_spin
omp_spin.shorten_idle_spin("target")
import torch
torch.set_num_threads(2)
def threads():
    return len(os.listdir("/proc/self/task"))
x = torch.ones(1_000_000)
x.add_(1.0)
working = threads()
omp_spin.release_idle_workers()
deadline = time.monotonic() + 5
while threads() >= working and time.monotonic() < deadline:
    time.sleep(0.01)
released = threads()
x.add_(1.0)
print(working, released, threads(), float(x[0]))
"""


def thread_counts_around_a_release(**env: str) -> list[float]:
    return [float(n) for n in run_probe(RELEASE_PROBE, [], env).split()]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_release_ends_the_idle_workers_and_the_next_region_starts_new_ones() -> None:
    working, released, again, value = thread_counts_around_a_release()
    assert released == working - 1, (working, released)  # two threads: one worker
    assert again == working and value == 3.0


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_release_leaves_the_workers_of_a_user_who_chose_the_spin() -> None:
    working, released, again, _ = thread_counts_around_a_release(GOMP_SPINCOUNT="300000")
    assert released == working == again
