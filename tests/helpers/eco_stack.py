"""One live stack for the ecosystem tests (tests/test_eco_*.py): target, an EAGLE draft
replica with the shipped head, and a router with its HTTP API and /metrics on.

Session-scoped and registered in conftest.py (a fixture imported into each test module would
be one per module), so that the HTTP, metrics, error and Node.js tests share one start; the test
files are named test_eco_* so that they run one after another and the stack is not held
longer than needed. Tests leave it idle and do not assume an absolute counter value.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from splitspec.launcher import LocalStack
from tests.helpers.rpc import Router

START_TIMEOUT_S = 300.0
CPU_FP32 = ["--device", "cpu", "--dtype", "float32"]
HTTP_TIMEOUT_S = 120.0


@dataclass
class EcoStack:
    stack: LocalStack
    router: Router
    model_name: str

    @property
    def base_url(self) -> str:
        return f"http://{self.stack.http_address}"

    def post(self, path: str, body: bytes | dict) -> tuple[int, Any]:
        """POSTs raw bytes or a JSON object; returns the status and the decoded JSON reply."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path, data=data, headers={"Content-Type": "application/json"}
        )
        return _send(request)

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=HTTP_TIMEOUT_S) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()


def _send(request: urllib.request.Request) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="session")
def eco_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EcoStack]:
    stack = LocalStack(
        [*CPU_FP32, "--num-slots", "4096"],  # small pools: it idles beside other stacks
        # Long draft deadlines: a drafter never skipped as slow on a loaded box keeps the
        # stack's rounds, and so its block boundaries, alike between runs.
        ["--draft-deadline-floor", "5"],
        log_dir=tmp_path_factory.mktemp("stack-eco"),
        draft_args=[["--method", "eagle", "--dtype", "float32"]],
        http=True,
    )
    stack.start(timeout_s=START_TIMEOUT_S)
    router = Router(stack.router_address)
    try:
        status, body = EcoStack(stack, router, "").get("/v1/models")
        assert status == 200, body
        yield EcoStack(stack, router, json.loads(body)["data"][0]["id"])
    finally:
        router.close()
        stack.stop()
