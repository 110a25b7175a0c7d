"""Bad requests get INVALID_ARGUMENT with a message naming the problem (and, in gRPC's rich
error model, a BadRequest naming the field), and the server keeps serving; a second in-flight
request with the same id gets ALREADY_EXISTS."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2
from grpc_status import rpc_status

from protos import generation_pb2 as pb
from tests.helpers.prompts import chat_ids
from tests.helpers.rpc import Router, greedy

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]

# Edits of a valid request; limits come from GetModelInfo, as a client would read them.
Edit = Callable[[pb.GenerateRequest, pb.ModelInfo], None]


def _no_input(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
    r.ClearField("input")


def _text(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
    r.text = ""


def _chat(*roles: str) -> Edit:
    def edit(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
        r.messages.SetInParent()
        for role in roles:
            r.messages.items.add(role=role, content="hi")

    return edit


def _ids(make: Callable[[pb.ModelInfo], list[int]]) -> Edit:
    def edit(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
        r.input_ids.ids[:] = make(info)

    return edit


def _sampling(**values: Callable[[pb.ModelInfo], float]) -> Edit:
    def edit(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
        for name, value in values.items():
            setattr(r.sampling, name, value(info))

    return edit


def _const(value: float) -> Callable[[pb.ModelInfo], float]:
    return lambda info: value


def _stop_id(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
    r.sampling.stop_token_ids.append(info.vocab_size)


def _empty_stop(r: pb.GenerateRequest, info: pb.ModelInfo) -> None:
    r.sampling.stop.append("")


# (case, edit, words the message must contain; "{...}" is formatted with the ModelInfo)
CASES: list[tuple[str, Edit, tuple[str, ...]]] = [
    ("no input", _no_input, ("input", "empty")),
    ("empty text", _text, ("empty",)),
    ("empty input_ids", _ids(lambda info: []), ("empty",)),
    ("empty messages", _chat(), ("empty",)),
    ("unknown chat role", _chat("user", "wizard"), ("role", "wizard")),
    ("max_new_tokens 0", _sampling(max_new_tokens=_const(0)), ("max_new_tokens",)),
    (
        "max_new_tokens above the limit",
        _sampling(max_new_tokens=lambda info: info.max_new_tokens_limit + 1),
        ("max_new_tokens", "{info.max_new_tokens_limit}"),
    ),
    (
        "prompt as long as the context",
        _ids(lambda info: [42] * info.max_context_length),
        ("prompt", "{info.max_context_length}"),
    ),
    (
        "prompt longer than the context",
        _ids(lambda info: [42] * (info.max_context_length + 100)),
        ("prompt",),
    ),
    ("negative temperature", _sampling(temperature=_const(-0.5)), ("temperature",)),
    ("nan temperature", _sampling(temperature=_const(float("nan"))), ("temperature",)),
    ("top_p 0", _sampling(top_p=_const(0.0)), ("top_p",)),
    ("top_p 1.5", _sampling(top_p=_const(1.5)), ("top_p",)),
    ("negative top_k", _sampling(top_k=_const(-1)), ("top_k",)),
    ("negative input id", _ids(lambda info: [1, 2, -5]), ("vocabulary", "-5")),
    (
        "input id = vocab size",
        _ids(lambda info: [1, info.vocab_size]),
        ("vocabulary", "{info.vocab_size}"),
    ),
    ("input id far above vocab", _ids(lambda info: [2**40]), ("vocabulary",)),
    ("stop token id out of vocab", _stop_id, ("stop_token_ids",)),
    ("empty stop string", _empty_stop, ("stop",)),
]


def valid_request() -> pb.GenerateRequest:
    return greedy(chat_ids(HELLO), max_new_tokens=2)


def test_cases_are_valid_without_the_edit(router: Router) -> None:
    stream = router.generate(valid_request())
    assert stream.final.usage.completion_tokens >= 1


@pytest.mark.parametrize(("edit", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_is_rejected_and_server_keeps_serving(
    router: Router, edit: Edit, words: tuple[str, ...]
) -> None:
    info = router.model_info()
    request = valid_request()
    edit(request, info)
    with pytest.raises(grpc.RpcError) as err:
        router.generate(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    message = err.value.details()
    expected = [w.format(info=info) for w in words]
    assert all(w in message for w in expected), f"{message!r} should mention {expected}"
    stream = router.generate(valid_request())
    assert stream.final.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS)
    assert router.wait_idle().num_running == 0


# (case, edit, the field path and the description its BadRequest.FieldViolation gives)
FIELD_CASES: list[tuple[str, Edit, str, str]] = [
    ("top_p", _sampling(top_p=_const(1.5)), "sampling.top_p", "top_p must be in (0, 1], got 1.5"),
    (
        "max_new_tokens",
        _sampling(max_new_tokens=_const(0)),
        "sampling.max_new_tokens",
        "max_new_tokens must be at least 1",
    ),
    ("no input", _no_input, "input", "input is empty: set one of text, messages or input_ids"),
    ("empty text", _text, "input", "input is empty: text gives no tokens"),
]


@pytest.mark.parametrize(
    ("edit", "path", "description"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES]
)
def test_a_refusal_names_its_field_in_the_rich_error_model(
    router: Router, edit: Edit, path: str, description: str
) -> None:
    request = valid_request()
    edit(request, router.model_info())
    with pytest.raises(grpc.RpcError) as err:
        router.generate(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    status = rpc_status.from_call(err.value)  # also checks its code and message are the call's
    assert status is not None, "no grpc-status-details-bin in the trailing metadata"
    assert status.code == code_pb2.INVALID_ARGUMENT and status.message == description
    (detail,) = status.details
    bad = error_details_pb2.BadRequest()
    assert detail.Unpack(bad), detail.type_url
    (violation,) = bad.field_violations
    assert (violation.field, violation.description) == (path, description)


def test_duplicate_in_flight_request_id_is_already_exists(router: Router) -> None:
    request_id = "validation-duplicate-id"
    long_running = greedy(chat_ids(HELLO), 500, request_id)
    long_running.sampling.ignore_eos = True  # still running when the duplicate arrives
    first = router.stub.Generate(long_running, timeout=60)
    try:
        assert next(first).request_id == request_id  # in flight now
        with pytest.raises(grpc.RpcError) as err:
            router.generate(greedy(chat_ids(HELLO), 2, request_id))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert request_id in err.value.details()
        assert router.abort(request_id)
        *_, last = first
        assert last.finish_reason == pb.FINISH_REASON_ABORT
    finally:
        first.cancel()
    # Once finished, the id is free again.
    router.wait_idle()
    again = router.generate(greedy(chat_ids(HELLO), 2, request_id))
    assert again.final.request_id == request_id
