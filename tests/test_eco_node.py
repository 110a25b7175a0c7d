"""Clients in other languages against the live stack: the Node.js client (@grpc/grpc-js +
@grpc/proto-loader from npm) streams a generation; the reflection example finds the API
through server reflection alone, with no generated code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack
from tests.helpers.node import NO_NODE, NO_NODE_REASON, npm_installed

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
PROMPT = "Describe the ocean in a few sentences."
MAX_TOKENS = 16


def grpc_text(eco: EcoStack) -> tuple[str, int]:
    request = pb.GenerateRequest()
    request.messages.items.append(pb.ChatMessage(role="user", content=PROMPT))
    request.sampling.max_new_tokens = MAX_TOKENS
    request.sampling.temperature = 0.0
    stream = eco.router.generate(request)
    return stream.text, stream.final.usage.completion_tokens


@pytest.mark.skipif(NO_NODE, reason=NO_NODE_REASON)
def test_node_client_streams_a_generation(eco_stack: EcoStack) -> None:
    node_dir = npm_installed()
    result = subprocess.run(
        ["node", "generate.js", "--address", eco_stack.stack.router_address, "--max-tokens",
         str(MAX_TOKENS), "--json", PROMPT],
        cwd=node_dir, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    items = [json.loads(line) for line in result.stdout.splitlines()]
    final = items[-1]
    assert final["finish_reason"] == "FINISH_REASON_LENGTH"
    assert all(i["finish_reason"] == "FINISH_REASON_UNSPECIFIED" for i in items[:-1])
    assert len(items) >= 2, "one item only: nothing was streamed"
    text, completion_tokens = grpc_text(eco_stack)
    assert "".join(i["text"] for i in items) == text and text
    assert final["usage"]["completion_tokens"] == completion_tokens == MAX_TOKENS
    assert sum(len(i["token_ids"]) for i in items) == MAX_TOKENS


def test_reflection_example_lists_and_calls_the_api(eco_stack: EcoStack) -> None:
    script = REPO / "clients" / "shell" / "generate.sh"
    env = {**os.environ, "PYTHON": sys.executable, "SPLITSPEC_NO_GRPCURL": "1"}
    result = subprocess.run(
        ["bash", str(script), eco_stack.stack.router_address, PROMPT, str(MAX_TOKENS)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr
    services, _, reply = result.stdout.partition("\n---\n")
    assert "splitspec.v1.Generation" in services.split()
    assert "grpc.health.v1.Health" in services.split()
    assert reply.strip() == grpc_text(eco_stack)[0].strip()
