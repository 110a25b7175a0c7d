"""The draft service as a real process over gRPC (ngram, recording, scripted); the drafter
adapters and the engine's round bookkeeping without gRPC are in test_draft_engine.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from draft_service.test_drafters import record_path
from model_runtime.wire import tensor_to_pb
from plumbing.grpc_util import CHANNEL_OPTIONS
from protos import draft_pb2, draft_pb2_grpc
from splitspec.launcher import ServiceProcess, free_port, python_module

SERVICE_NAME = "splitspec.draft.v1.DraftModel"
START_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 10.0
REPEATING = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # ngram drafts 4, 1, 2, 3, 4 after it
SCRIPT = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
HIDDEN_SIZE = 8


class Replica:
    """A draft service process and a stub on it."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.process = ServiceProcess(
            name, python_module("draft_service", "--host", "127.0.0.1", "--port", str(port), *args),
            self.address, log_dir / f"{name}.log")
        self.channel: grpc.Channel | None = None

    def start(self) -> None:
        self.process.start()

    def connect(self) -> draft_pb2_grpc.DraftModelStub:
        self.process.wait_healthy(START_TIMEOUT_S)
        self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self.stub = draft_pb2_grpc.DraftModelStub(self.channel)
        return self.stub

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        self.process.stop()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("draft")


@pytest.fixture(scope="module")
def record_dir(root: Path) -> Path:
    return root / "records"


@pytest.fixture(scope="module")
def replicas(root: Path, record_dir: Path) -> Iterator[dict[str, Replica]]:
    (root / "script.json").write_text(json.dumps({"continuations": [SCRIPT]}))
    started = {
        "ngram": Replica("ngram", ["--method", "ngram"], root),
        "recording": Replica("recording", ["--method", "recording", "--record-dir",
                                           str(record_dir)], root),
        "scripted": Replica("scripted", ["--method", "scripted", "--num-draft-tokens", "4",
                                         "--script", str(root / "script.json")], root),
    }
    try:
        for replica in started.values():  # start all, then wait: the imports overlap
            replica.start()
        for replica in started.values():
            replica.connect()
        yield started
    finally:
        for replica in started.values():
            replica.stop()


@pytest.fixture(scope="module")
def ngram(replicas: dict[str, Replica]) -> draft_pb2_grpc.DraftModelStub:
    return replicas["ngram"].stub


@pytest.fixture(scope="module")
def recording(replicas: dict[str, Replica]) -> draft_pb2_grpc.DraftModelStub:
    return replicas["recording"].stub


def update(request_id: str, start_pos: int, token_ids: list[int], hidden_start_pos: int = 0,
           hidden: torch.Tensor | None = None) -> draft_pb2.ContextUpdate:
    msg = draft_pb2.ContextUpdate(request_id=request_id, start_pos=start_pos, token_ids=token_ids,
                                  hidden_start_pos=hidden_start_pos)
    if hidden is not None:
        msg.hidden.CopyFrom(tensor_to_pb(hidden))
    return msg


def propose(stub, *items: tuple[draft_pb2.ContextUpdate, int]) -> list[draft_pb2.DraftTree]:
    request = draft_pb2.ProposeRequest(
        items=[draft_pb2.ProposeItem(update=u, round=r) for u, r in items])
    return list(stub.Propose(request, timeout=RPC_TIMEOUT_S).trees)


def ingest(stub, *updates: draft_pb2.ContextUpdate) -> draft_pb2.IngestResponse:
    return stub.Ingest(iter([draft_pb2.IngestChunk(update=u) for u in updates]),
                       timeout=RPC_TIMEOUT_S)


def release(stub, *request_ids: str) -> int:
    return stub.Release(draft_pb2.ReleaseRequest(request_ids=request_ids),
                        timeout=RPC_TIMEOUT_S).num_released


def chain(tree: draft_pb2.DraftTree) -> list[int]:
    assert list(tree.parent_indices) == list(range(-1, len(tree.token_ids) - 1)), "not a chain"
    return list(tree.token_ids)


def assert_invalid(call) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details()


# --- ngram over gRPC -------------------------------------------------------------------------


def test_get_info(ngram, recording, replicas) -> None:
    info = ngram.GetInfo(draft_pb2.GetInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert (info.method, info.needs_hidden, info.num_steps, info.topk, info.num_draft_tokens,
            info.device, info.dtype) == ("ngram", False, 5, 4, 16, "cpu", "float32")
    assert info.vocab_size == 0  # any vocabulary: n-gram copies the context
    info = recording.GetInfo(draft_pb2.GetInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert (info.method, info.needs_hidden) == ("recording", True)
    info = replicas["scripted"].stub.GetInfo(draft_pb2.GetInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert (info.method, info.needs_hidden, info.num_draft_tokens) == ("scripted", False, 4)


def test_health_and_reflection(replicas) -> None:
    channel = replicas["ngram"].channel
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=RPC_TIMEOUT_S)
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_propose_repetitive_context_drafts_the_loop(ngram) -> None:
    (tree,) = propose(ngram, (update("rep", 0, REPEATING), 0))
    assert tree.request_id == "rep" and not tree.needs_context
    assert chain(tree) == [3, 4, 1, 2, 3, 4]  # root + num_steps (5) tokens
    assert list(tree.scores) == [1.0] * 6
    (tree,) = propose(ngram, (update("rep", 11, [4]), 1))
    assert chain(tree) == [4, 1, 2, 3, 4, 1]
    release(ngram, "rep")


def test_misaligned_updates_need_context_and_leave_state_alone(ngram) -> None:
    (tree,) = propose(ngram, (update("never-seen", 5, [1, 2]), 0))
    assert tree.needs_context and not tree.token_ids
    propose(ngram, (update("gap", 0, REPEATING), 0))
    for start_pos in (3, 12, 0):  # behind, ahead, restart of a held request
        (tree,) = propose(ngram, (update("gap", start_pos, [4]), 1))
        assert tree.needs_context
    (tree,) = propose(ngram, (update("gap", 11, [4]), 1))
    assert chain(tree) == [4, 1, 2, 3, 4, 1]
    release(ngram, "gap")


def test_batch_answers_in_item_order(ngram) -> None:
    trees = propose(ngram, (update("b1", 0, REPEATING), 0), (update("b2", 7, [1]), 0),
                    (update("b3", 0, [9]), 0))
    assert [t.request_id for t in trees] == ["b1", "b2", "b3"]
    assert chain(trees[0])[:2] == [3, 4]
    assert trees[1].needs_context
    assert chain(trees[2]) == [9]  # nothing to look up: root only
    assert release(ngram, "b1", "b2", "b3") == 2


def test_ingest_in_chunks_then_propose(ngram) -> None:
    reply = ingest(ngram, update("ing", 0, REPEATING[:4]), update("ing", 4, REPEATING[4:8]),
                   update("ing", 8, REPEATING[8:]))
    assert (reply.num_tokens, reply.num_hidden_rows) == (11, 0)
    assert reply.compute_ms > 0
    (tree,) = propose(ngram, (update("ing", 11, []), 0))
    assert chain(tree) == [3, 4, 1, 2, 3, 4]
    # A second Ingest replaces the context (and forgets round 0's tree).
    assert ingest(ngram, update("ing", 0, [5, 6, 5])).num_tokens == 3
    (tree,) = propose(ngram, (update("ing", 3, []), 0))
    assert chain(tree)[:2] == [5, 6]
    release(ngram, "ing")


def test_propose_retry_is_idempotent(ngram) -> None:
    propose(ngram, (update("retry", 0, REPEATING), 0))
    first = propose(ngram, (update("retry", 11, [4]), 1))
    again = propose(ngram, (update("retry", 11, [4]), 1))
    assert first == again and not first[0].needs_context
    (tree,) = propose(ngram, (update("retry", 12, [1]), 2))  # 13 if [4] had been appended twice
    assert not tree.needs_context
    assert_invalid(lambda: propose(ngram, (update("retry", 12, [2]), 2)))  # same round, new update
    release(ngram, "retry")


def test_propose_stream_answers_as_propose(ngram) -> None:
    """ProposeStream (the router's path) answers each request as Propose would, in order, and
    ends with Propose's status on an error."""
    rounds = [(update("st", 0, REPEATING), 0), (update("st", 11, [4]), 1),
              (update("st", 12, [1]), 2)]
    requests = [draft_pb2.ProposeRequest(items=[draft_pb2.ProposeItem(update=u, round=r)])
                for u, r in rounds]
    streamed = [reply.trees[0] for reply in ngram.ProposeStream(iter(requests),
                                                                 timeout=RPC_TIMEOUT_S)]
    release(ngram, "st")
    unary = [propose(ngram, item)[0] for item in rounds]
    release(ngram, "st")
    assert streamed == unary and chain(unary[1]) == [4, 1, 2, 3, 4, 1]
    bad = draft_pb2.ProposeRequest(items=[draft_pb2.ProposeItem(update=update("", 0, [1]))])
    with pytest.raises(grpc.RpcError) as info:
        list(ngram.ProposeStream(iter([requests[0], bad, requests[1]]), timeout=RPC_TIMEOUT_S))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    release(ngram, "st")


def held(stub) -> int:
    return stub.GetInfo(draft_pb2.GetInfoRequest(), timeout=RPC_TIMEOUT_S).num_requests


def test_release_is_idempotent(ngram) -> None:
    before = held(ngram)  # what earlier tests on this replica left
    propose(ngram, (update("rel", 0, REPEATING), 0))
    assert held(ngram) == before + 1  # counted, and asking changes nothing
    assert held(ngram) == before + 1
    assert release(ngram, "rel", "not-held") == 1
    assert held(ngram) == before
    assert release(ngram, "rel") == 0
    (tree,) = propose(ngram, (update("rel", 11, [4]), 1))
    assert tree.needs_context


def test_invalid_arguments(ngram) -> None:
    bad_bytes = draft_pb2.ContextUpdate(request_id="x", token_ids=[1])
    bad_bytes.hidden.CopyFrom(tensor_to_pb(torch.ones(2, 3)))
    bad_bytes.hidden.data = bad_bytes.hidden.data[:-4]
    cases = [
        lambda: propose(ngram, (update("", 0, [1]), 0)),
        lambda: propose(ngram, (update("x", 0, [1, -2]), 0)),
        lambda: propose(ngram, (bad_bytes, 0)),
        lambda: propose(ngram, (update("x", 0, [1], hidden=torch.ones(3)), 0)),
        lambda: propose(ngram, (update("x", 0, [1]), 0), (update("x", 1, [2]), 0)),
        lambda: ingest(ngram),
        lambda: ingest(ngram, update("x", 3, [1])),
        lambda: ingest(ngram, update("x", 0, [1]), update("y", 1, [2])),
        lambda: ingest(ngram, update("x", 0, [1]), update("x", 2, [2])),
        lambda: ingest(ngram, update("x", 0, [1], 0, torch.ones(1, 4)),
                       update("x", 1, [2], 0, torch.ones(1, 4))),
    ]
    for case in cases:
        assert_invalid(case)
    (tree,) = propose(ngram, (update("x", 1, [2]), 0))
    assert tree.needs_context  # nothing of the rejected calls stayed behind


# --- recording and scripted over gRPC --------------------------------------------------------


def read_record(record_dir: Path, request_id: str) -> dict:
    return json.loads(record_path(record_dir, request_id).read_text())


def test_recording_writes_tokens_and_hidden_rows(recording, record_dir) -> None:
    request_id = "rec/1"  # quoted in the file name
    hidden = torch.arange(10 * HIDDEN_SIZE, dtype=torch.float32).reshape(10, HIDDEN_SIZE) / 7
    reply = ingest(recording, update(request_id, 0, REPEATING[:6], 0, hidden[:5]),
                   update(request_id, 6, REPEATING[6:], 5, hidden[5:10]))
    assert (reply.num_tokens, reply.num_hidden_rows) == (11, 10)
    record = read_record(record_dir, request_id)
    assert record["token_ids"] == REPEATING
    assert (record["num_hidden_rows"], record["hidden_size"]) == (10, HIDDEN_SIZE)
    assert record["hidden_sum"] == pytest.approx(hidden.double().sum().item())
    assert record["hidden_row_sums"] == pytest.approx(hidden.double().sum(dim=1).tolist())

    row = torch.full((1, HIDDEN_SIZE), 0.5)
    (tree,) = propose(recording, (update(request_id, 11, [4], 10, row), 0))
    assert chain(tree) == [4, 1, 2, 3, 4, 1]
    record = read_record(record_dir, request_id)
    assert record["token_ids"] == [*REPEATING, 4] and record["num_hidden_rows"] == 11
    assert record["hidden_sum"] == pytest.approx(hidden.double().sum().item() + 4.0)

    (tree,) = propose(recording, (update(request_id, 12, [1], 3, row), 1))  # rows misaligned
    assert tree.needs_context
    assert read_record(record_dir, request_id)["num_mismatches"] == 1
    assert release(recording, request_id) == 1
    record = read_record(record_dir, request_id)
    assert record["released"] and len(record["chunks"]) == 3


def test_scripted_proposes_the_aligned_continuation(replicas) -> None:
    stub = replicas["scripted"].stub
    (tree,) = propose(stub, (update("s", 0, [7, 8, 10, 11]), 0))
    assert chain(tree) == [11, 12, 13, 14]  # num_draft_tokens 4: root + 3
    (tree,) = propose(stub, (update("s", 4, [12, 13, 14, 15]), 1))
    assert chain(tree) == [15, 16, 17, 18]
    (tree,) = propose(stub, (update("s", 8, [99]), 2))
    assert chain(tree) == [99]
    release(stub, "s")
