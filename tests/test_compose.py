"""The compose stack in real containers (podman, images built from scratch, no registry).

Builds the base image with debootstrap and both images from deploy/Containerfile (the
wheelhouse: no PyPI in the build), starts docker-compose.yml with podman-compose and three
draft replicas, then, with the router running throughout: greedy output with speculation
equals target-only; drafts scale 3 -> 1 -> 2 and the router follows through DNS, requests
landing on the new replicas; a draft container is SIGKILLed during 20 concurrent greedy streams,
none fails and none changes. The checks run inside the compose network (tests/compose/checks.py,
the `tester` service); this driver scales, kills and reads their JSON.

Runs in CI (CI=true) or with SPLITSPEC_CONTAINER_TESTS=1, as root with podman installed
(.ci/run installs it); there a missing podman fails the test instead of skipping it, unless
.ci/run found too little disk for the images (SPLITSPEC_CONTAINER_SKIP, its figures).
In CI the images build and the stack starts in the background while other tests run
(tests/helpers/compose_stack.py); the first test waits for them. SPLITSPEC_REUSE_IMAGES=1
skips the build when the images exist (local iteration only).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import pytest

from tests.helpers.compose_stack import (
    DISK_SKIP_REASON,
    EARLY,
    ENABLED,
    IMAGES,
    PHASE_TIMES,
    PROJECT,
    compose,
    run,
    tear_down,
    unnice_project,
    wait_up,
)

if not ENABLED:
    pytest.skip(
        DISK_SKIP_REASON
        or "container test: runs in CI (CI=true) or with SPLITSPEC_CONTAINER_TESTS=1",
        allow_module_level=True,
    )
# Serial (`make test` runs it after the parallel run, alone): its stack starts in the background
# when pytest collects it, and its streams should not share 2 cores with a second test process.
pytestmark = [pytest.mark.timeout(1200), pytest.mark.serial]  # the first waits for the images
NUM_STREAMS = 20
UP_TIMEOUT_S = 1100


def phase(*args: str) -> dict:
    """One checks.py phase in the tester service; its JSON line."""
    started = time.monotonic()
    done = compose("--profile", "test", "run", "--rm", "tester", *args, check=False)
    PHASE_TIMES.append(f"phase {' '.join(args)}: {time.monotonic() - started:.1f} s")
    result = last_json(done.stdout)
    assert done.returncode == 0 and result.get("ok"), f"{args}: {done.stdout}\n{done.stderr}"
    return result


def last_json(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def drafts() -> list[str]:
    out = run(
        "podman",
        "ps",
        "--filter",
        "status=running",
        "--filter",
        f"label=com.docker.compose.project={PROJECT}",
        "--filter",
        "label=com.docker.compose.service=draft",
        "--format",
        "{{.Names}}",
    )
    return sorted(out.stdout.split())


def address(container: str) -> str:
    ip = run(
        "podman",
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        container,
    ).stdout.strip()
    return f"{ip}:50071"


def scale(count: int) -> None:
    """`up --scale` adds replicas; podman-compose 1.6 never removes any, so extras are stopped
    (SIGTERM: they drain) and removed newest first, as Docker Compose scales down."""
    started = time.monotonic()
    running = sorted(drafts(), key=lambda n: int(n.rsplit("_", 1)[1]))
    if count > len(running):
        compose("up", "-d", "--scale", f"draft={count}", "draft")
    for name in running[count:]:
        run("podman", "stop", "-t", "10", name)
        run("podman", "rm", name)
    assert len(drafts()) == count, drafts()
    PHASE_TIMES.append(f"scale draft={count}: {time.monotonic() - started:.1f} s")


@pytest.fixture(scope="module")
def stack() -> Iterator[None]:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed (.ci/run installs it: deploy/ci/install-podman.sh)")
    times = wait_up(UP_TIMEOUT_S)  # started early in CI: tests/helpers/compose_stack.py
    print(EARLY.log)
    print(f"container test: {unnice_project()} threads back at nice 0")  # the others are done
    up = time.monotonic()
    try:
        yield
    except BaseException:
        print(compose("logs", check=False).stdout[-20000:])
        raise
    finally:
        print(
            f"container test: images {times['images_s']:.0f} s, up {times['up_s']:.0f} s, "
            f"tests {time.monotonic() - up:.0f} s"
        )
        tear_down()


def test_router_image_has_no_torch_and_runs_as_non_root(stack) -> None:
    router, model = IMAGES
    probe = run(
        "podman", "run", "--rm", "--entrypoint", "python", router, "-c", "import torch", check=False
    )
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr
    for image in IMAGES:
        assert (
            run("podman", "image", "inspect", "-f", "{{.Config.User}}", image).stdout.strip()
            == "10001"
        )


def test_greedy_output_equals_target_only(stack) -> None:
    assert len(phase("wait-drafts", "3")["healthy"]) == 3
    assert phase("greedy-equality")["accepted_tokens"] > 0


def test_scaling_3_1_2_is_followed_without_a_restart(stack) -> None:
    router_id = run("podman", "inspect", "-f", "{{.Id}}", f"{PROJECT}_router_1").stdout
    before = set(drafts())
    scale(1)
    (kept,) = drafts()
    assert phase("wait-drafts", "1")["healthy"] == [address(kept)]
    scale(2)
    (new,) = set(drafts()) - {kept}
    assert phase("wait-drafts", "2")["healthy"] == sorted([address(kept), address(new)])
    held = phase("spread")["held_requests"]
    assert address(new) in held, "requests never landed on the new replica"
    assert run("podman", "inspect", "-f", "{{.Id}}", f"{PROJECT}_router_1").stdout == router_id
    assert before  # three replicas ran before the scale-down


def test_killing_a_draft_during_20_streams_fails_nothing(stack) -> None:
    phase("wait-drafts", "2")
    name = f"{PROJECT}-kill-streams"
    run("podman", "rm", "-f", name, check=False)
    compose(
        "--profile", "test", "run", "-d", "--name", name, "tester", "kill-streams", str(NUM_STREAMS)
    )
    try:
        wait_for_log(name, "STREAMS-RUNNING", timeout_s=300)
        victim, survivor = drafts()
        victim_address, survivor_address = address(victim), address(survivor)  # gone once killed
        run("podman", "kill", "--signal", "KILL", victim)
        state = run("podman", "inspect", "-f", "{{.State.Running}}", name).stdout.strip()
        assert state == "true", "the streams ended before the kill: nothing was tested"
        code = run("podman", "wait", name, timeout=300).stdout.strip()
        logs = run("podman", "logs", name).stdout
        result = last_json(logs)
        assert code == "0" and result.get("ok"), logs
        # The streams may end before the router has noticed the death (DNS drops the name
        # within a few lookups; the breaker ejects a silent replica after its probes fail):
        # wait, bounded, until the router serves with the survivor alone.
        after = phase("wait-drafts", "1")["healthy"]
        assert after == [survivor_address] and victim_address not in after, after
    finally:
        run("podman", "rm", "-f", name, check=False)


def wait_for_log(container: str, marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = run("podman", "logs", container, check=False)
        if marker in logs.stdout:
            return
        if (
            run(
                "podman", "inspect", "-f", "{{.State.Running}}", container, check=False
            ).stdout.strip()
            == "false"
        ):
            raise AssertionError(f"{container} ended before {marker}:\n{logs.stdout}{logs.stderr}")
        time.sleep(0.1)
    raise TimeoutError(f"no {marker} from {container} in {timeout_s} s")
