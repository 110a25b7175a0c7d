"""Discovery in a real router (real processes, real gRPC, tiny fp64 Llama).

The router gets three draft sources at once: `--draft-dns localhost:P` where an n-gram draft
serves (it must join through DNS and speculate), `--draft-dns` of a name that does not exist,
and a static `--draft` that is the target (a gRPC server, but no draft). The two bad ones
must show up in the router's log and GetServerStatus and fail no request: every greedy output
equals the same request sent target-only.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from splitspec.launcher import LocalStack
from tests.helpers.processes import ngram_draft_process
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    FP64,
    START_TIMEOUT_S,
    Router,
    ids_request,
    random_prompts,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(240)
MISSING = "no-such-draft.invalid:50071"
NUM_PROMPTS = 12


def missing_name_error() -> str:
    """What the router must say of MISSING here: "does not resolve" where a resolver answers that
    the name does not exist; a machine without one (no DNS server, as on the GPU box) can only
    say that the lookup failed, and the router must not take that as an answer."""
    host = MISSING.rsplit(":", 1)[0]
    try:
        socket.getaddrinfo(host, 50071)
    except socket.gaierror as err:
        if err.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return f"{host} does not resolve"
        return f"lookup of {host} failed"
    raise AssertionError(f"{host} resolves on this machine")


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def test_dns_found_draft_joins_and_bad_sources_fail_nothing(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    draft = ngram_draft_process(tmp_path / "draft.log")
    port = int(draft.address.rsplit(":", 1)[1])
    dns_args = ["--draft-dns", f"localhost:{port}", "--draft-dns", MISSING]
    stack = LocalStack(
        ["--model", str(tiny_model_dir), *FP64, "--threads", "1"],
        ["--model", str(tiny_model_dir), *dns_args, "--draft-dns-interval", "0.5"],
        log_dir=tmp_path,
    )
    stack.router.command += ["--draft", stack.target_address]  # the target is no draft
    draft.start()
    router = None
    try:
        draft.wait_healthy(START_TIMEOUT_S)
        stack.start(START_TIMEOUT_S)
        router = Router(stack.router_address)
        status = wait_for(
            lambda: next(
                (s for s in [router.status()] if any(r.healthy for r in s.draft_replicas)), None
            ),
            30,
            "the DNS-found draft never became healthy",
        )
        check_status(router, stack, port)
        prompts = random_prompts(7, NUM_PROMPTS, 49152, max_len=120)
        spec = router.generate_many([ids_request(p, 40, True) for p in prompts])
        plain = router.generate_many([ids_request(p, 40, False) for p in prompts])
        assert [s.token_ids for s in spec] == [s.token_ids for s in plain]
        assert router.status().speculation.verify_steps > status.speculation.verify_steps
        log = (tmp_path / "router.log").read_text()
        assert "not a draft service" in log and missing_name_error() in log
    finally:
        if router is not None:
            router.close()
        stack.stop()
        draft.stop()


def check_status(router: Router, stack: LocalStack, port: int) -> None:
    status = router.status()
    by_address = {r.address: r for r in status.draft_replicas}
    found = by_address[f"127.0.0.1:{port}"]
    assert found.healthy and found.method == "ngram" and found.source == f"localhost:{port}"
    target = by_address[stack.target_address]
    assert not target.healthy and target.source == "static"
    assert target.error.startswith("not a draft service")
    discovery = {d.name: d for d in status.draft_discovery}
    ok, missing = discovery[f"localhost:{port}"], discovery[MISSING]
    assert list(ok.addresses) == [f"127.0.0.1:{port}"] and ok.error == ""
    assert abs(ok.last_resolved_unix_s - time.time()) < 10 and ok.num_lookups >= 1
    assert list(missing.addresses) == [] and missing_name_error() in missing.error
    assert missing.last_resolved_unix_s == 0 and missing.last_attempt_unix_s > 0
