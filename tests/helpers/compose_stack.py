"""The podman side of tests/test_compose.py: images, the compose project, and its early start.

The images and the stack take minutes of mostly waiting (downloads, layer commits, the target
converting the model inside its container), so in CI they are made in the background while
other tests run: .ci/run starts the image build (deploy/ci/start-image-build.sh, named by
SPLITSPEC_IMAGE_BUILD) before `make test`, and once pytest has collected the compose test,
``start_early`` brings the stack up on a thread after that build. The test's fixture then only
waits for it (``wait_up``), and removes the project when the module ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

from splitspec.launcher import free_ports

ROOT = Path(__file__).resolve().parents[2]
# Set by .ci/run when the disk is too short for the images: why, with its figures.
DISK_SKIP_REASON = os.environ.get("SPLITSPEC_CONTAINER_SKIP", "")
ENABLED = (
    os.environ.get("CI") == "true" or os.environ.get("SPLITSPEC_CONTAINER_TESTS") == "1"
) and not DISK_SKIP_REASON
W = Path(os.environ.get("SPLITSPEC_CI_DIR", "/var/tmp/splitspec-ci"))
PROJECT = "splitspec-it"
IMAGES = ("localhost/splitspec-router:0.1.0", "localhost/splitspec-model:0.1.0")
BUILD_WAIT_S = 900
ENV = {
    **os.environ,
    "CONTAINERS_CONF": str(W / "containers.conf"),
    "CONTAINERS_STORAGE_CONF": str(W / "storage.conf"),
}


def run(*cmd: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def compose(
    *args: str, timeout: float = 300, check: bool = True, nice: bool = False
) -> subprocess.CompletedProcess:
    podman_compose = str(W / "venv" / "bin" / "podman-compose")
    niced = ("nice", "-n", "19") if nice else ()
    return run(*niced, podman_compose, "-p", PROJECT, *args, timeout=timeout, check=check)


def images_exist() -> bool:
    return all(run("podman", "image", "exists", i, check=False).returncode == 0 for i in IMAGES)


def build_images() -> str:
    """Builds them, or waits for the build that .ci/run started in the background; its log."""
    status = os.environ.get("SPLITSPEC_IMAGE_BUILD")
    if not status:
        return run(str(ROOT / "deploy" / "ci" / "build-images.sh"), timeout=600).stderr
    rc, deadline = Path(status) / "rc", time.monotonic() + BUILD_WAIT_S
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(1)
    log = (Path(status) / "log").read_text()
    assert rc.exists(), f"the background image build did not end in {BUILD_WAIT_S} s:\n{log}"
    assert rc.read_text().strip() == "0", f"the background image build failed:\n{log}"
    assert images_exist(), log
    return log


def remove_project() -> None:
    compose("down", "-t", "1", check=False)
    # down knows only the compose file's replica count; scaled ones go by label.
    left = run(
        "podman",
        "ps",
        "-aq",
        "--filter",
        f"label=com.docker.compose.project={PROJECT}",
        check=False,
    ).stdout.split()
    if left:
        run("podman", "rm", "-f", "-t", "1", *left, check=False)


def bring_up() -> dict[str, float]:
    """Images (unless SPLITSPEC_REUSE_IMAGES=1 finds them), then target, router and three
    draft replicas; returns how long each part took (the build's log goes to EARLY.log)."""
    started = time.monotonic()
    if not (os.environ.get("SPLITSPEC_REUSE_IMAGES") == "1" and images_exist()):
        EARLY.log = build_images()
    built = time.monotonic()
    remove_project()  # leftovers of an interrupted run
    # published on 127.0.0.1; picked just before use
    ENV["ROUTER_PORT"], ENV["ROUTER_HTTP_PORT"] = map(str, free_ports(2))
    # Niced like the image build (its services inherit it): their start (the target converts
    # the model) must not slow the tests that run meanwhile; by the container test, it is done.
    compose("up", "-d", "--scale", "draft=3", "target", "draft", "router", nice=True)
    return {"images_s": built - started, "up_s": time.monotonic() - built}


class EarlyStart:
    """``bring_up`` on a thread, started once; its result or its error for ``wait_up``."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.times: dict[str, float] = {}
        self.error: BaseException | None = None
        self.removed = False
        self.log = ""  # of the image build, printed by the test (not from this thread)

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="compose-up", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            self.times = bring_up()
        except BaseException as err:  # re-raised in the test by wait_up
            self.error = err

    def wait(self, timeout_s: float) -> dict[str, float]:
        self.start()
        assert self.thread is not None
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"images and stack not up after {timeout_s:.0f} s"
        if self.error is not None:
            raise self.error
        return self.times


EARLY = EarlyStart()
# "phase wait-drafts 1: 2 s" lines of tests/test_compose.py, for the run's summary: the
# scaling check took 14-84 s in CI runs (against 11 s alone) and only its total was shown.
PHASE_TIMES: list[str] = []


def start_early(selected_paths: set[str]) -> None:
    """From conftest once tests are collected: only in CI and when the compose test runs."""
    if ENABLED and os.environ.get("SPLITSPEC_IMAGE_BUILD") and "test_compose.py" in selected_paths:
        EARLY.start()


def wait_up(timeout_s: float) -> dict[str, float]:
    return EARLY.wait(timeout_s)


def unnice_project() -> int:
    """Puts the stack's processes back at nice 0; returns how many threads it reniced.

    They start at nice 19 so that they only take CPU the other tests leave idle. The container
    test runs last, when those tests are done, but at 19 the stack still got almost no CPU
    whenever anything else ran on the machine (another session's tests on the dev box): the
    kill test took 17 s to 213 s across CI runs there. Niceness is per thread on Linux, so
    every thread of every process in the containers is set.
    """
    ids = run("podman", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}",
              check=False).stdout.split()  # fmt: skip
    if not ids:
        return 0
    inspected = run("podman", "inspect", "-f", "{{.State.Pid}}", *ids, check=False).stdout
    roots = [int(pid) for pid in inspected.split() if pid.isdigit() and int(pid) > 0]
    count = 0
    for pid in process_tree(roots):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.setpriority(os.PRIO_PROCESS, int(task.name), 0)
                count += 1
    return count


def process_tree(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants."""
    listing = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in listing.stdout.splitlines():
        pid, ppid = (int(field) for field in line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tear_down() -> None:
    remove_project()
    EARLY.removed = True


def tear_down_if_started() -> None:
    """At the end of the session: a stack started early whose test never ran goes too."""
    if EARLY.thread is not None and not EARLY.removed:
        EARLY.thread.join(BUILD_WAIT_S)
        tear_down()
