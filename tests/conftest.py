"""Fixtures for end-to-end tests: real target + router processes on the default model.

``stack`` is one LocalStack shared by the whole session (SmolLM2-135M, CPU, fp32); tests that
need their own settings (a tiny KV pool, other limits) start one through ``make_stack`` or
``stack_launcher``. Every process started here is stopped at the end of its scope, whether the
tests passed or not; the launcher's PR_SET_PDEATHSIG also ends them if pytest itself dies.
"""

from __future__ import annotations

import os

# Before anything imports grpc: with fork support on, a child that LocalStack spawns while this
# process has live channels may abort before exec (see test_e2e_launcher.py, xfail). Off, the
# spawn path runs no gRPC fork handlers; the services themselves never fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
# Before torch loads OpenMP, for this process and every service it starts: idle OpenMP threads
# sleep instead of spinning. Tests run several torch processes on two cores (target, drafts,
# HF here), and spinning threads took the cores from the ones with work: on a busy 2-core box
# test_e2e_batching + test_e2e_prefix_cache took 432 s spinning, 165 s passive.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Callable, Iterator, Sequence  # noqa: E402

import pytest  # noqa: E402

from splitspec.launcher import LocalStack  # noqa: E402
from tests.helpers import compose_stack  # noqa: E402
from tests.helpers.eco_stack import eco_stack  # noqa: E402, F401 (one stack for test_eco_*)
from tests.helpers.reference import HFReference, TieCase  # noqa: E402
from tests.helpers.rpc import Router  # noqa: E402

START_TIMEOUT_S = 300.0  # first start on an empty cache converts the GGUF (~6 s)
CPU_FP32 = ["--device", "cpu", "--dtype", "float32"]

StackFactory = Callable[..., LocalStack]

TIE_CASE = "greedy tie case"  # the name of a test's report property that carries one


class StackLauncher:
    """Starts stacks with their logs under pytest's temp dir and stops each exactly once."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp_path_factory = tmp_path_factory
        self.running: list[LocalStack] = []

    def start(
        self, name: str, target_args: Sequence[str] = (), router_args: Sequence[str] = ()
    ) -> LocalStack:
        log_dir = self.tmp_path_factory.mktemp(f"stack-{name}")
        stack = LocalStack([*CPU_FP32, *target_args], list(router_args), log_dir=log_dir)
        stack.start(timeout_s=START_TIMEOUT_S)  # stops what it started if it fails
        self.running.append(stack)
        return stack

    def stop(self, stack: LocalStack) -> None:
        if stack in self.running:
            self.running.remove(stack)
            stack.stop()

    def stop_all(self) -> None:
        for stack in reversed(list(self.running)):
            self.stop(stack)


@pytest.fixture(scope="session")
def stack_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackLauncher]:
    launcher = StackLauncher(tmp_path_factory)
    try:
        yield launcher
    finally:
        launcher.stop_all()


@pytest.fixture(scope="session")
def stack(stack_launcher: StackLauncher) -> LocalStack:
    """The shared stack: default model and settings. Tests must leave it idle."""
    return stack_launcher.start("shared")


@pytest.fixture
def make_stack(stack_launcher: StackLauncher) -> Iterator[StackFactory]:
    """Starts a stack of one's own, e.g. ``make_stack("tiny", target_args=["--num-slots",
    "600"])``; it is stopped when the test ends."""
    mine: list[LocalStack] = []

    def make(
        name: str, target_args: Sequence[str] = (), router_args: Sequence[str] = ()
    ) -> LocalStack:
        mine.append(stack_launcher.start(name, target_args, router_args))
        return mine[-1]

    try:
        yield make
    finally:
        for s in mine:
            stack_launcher.stop(s)


@pytest.fixture(scope="session")
def router(stack: LocalStack) -> Iterator[Router]:
    client = Router(stack.router_address)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def hf() -> HFReference:
    """HF transformers on the same GGUF, loaded on first use (~11 s)."""
    return HFReference()


@pytest.fixture
def tie_cases(request: pytest.FixtureRequest) -> Iterator[list[TieCase]]:
    """Allowed differences at near-ties, listed at the end of the run. They travel in the
    test's report, so that under xdist the workers hand them to the process that prints."""
    cases: list[TieCase] = []
    yield cases
    request.node.user_properties.extend((TIE_CASE, str(case)) for case in cases)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = [r for kind in terminalreporter.stats.values() for r in kind]
    cases = [value for r in reports for name, value in getattr(r, "user_properties", ())
             if name == TIE_CASE and r.when == "teardown"]  # fmt: skip
    if cases:
        terminalreporter.section("greedy tie cases (allowed: HF top-2 gap < 1e-2)")
        for case in cases:
            terminalreporter.write_line(case)
    if compose_stack.PHASE_TIMES:
        terminalreporter.section("container test phases")
        for line in compose_stack.PHASE_TIMES:
            terminalreporter.write_line(line)


def _run_order(item: pytest.Item) -> int:
    return item.path.name != "test_compose.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The container test runs first of its run (in `make test` the serial one, after the
    parallel run), the others after it, once its stack is gone. Its images build and its stack
    starts in the background (niced), and the other serial tests time windows of the wall
    clock: CI's machine failed them beside that work, niced or not (a burst's refusals at a
    60 ms median against 13 ms alone; SCHED_IDLE spinners starved)."""
    items.sort(key=_run_order)  # stable: order kept otherwise


def pytest_collection_finish(session: pytest.Session) -> None:
    """The container test's images and stack start now, in the background (CI only)."""
    compose_stack.start_early({item.path.name for item in session.items})


def pytest_sessionfinish(session: pytest.Session) -> None:
    compose_stack.tear_down_if_started()
