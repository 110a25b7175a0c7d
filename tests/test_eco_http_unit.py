"""The HTTP app's edges without a stack: the API-key hook answers 401 in OpenAI's shape before
anything else runs, and router errors map onto the statuses the gRPC API's codes mean."""

from __future__ import annotations

import asyncio
import json

import pytest

from router.errors import InvalidRequest, Overloaded, ServiceFailure
from router.openai_api.app import OpenAIServer
from router.openai_api.errors import from_router_error
from router.openai_api.protocol import parse_chat, parse_completion


class _NoServicer:
    """The key check and body parsing come before any use of the servicer."""

    scheduler = None


def call(
    app, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> tuple[int, dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1234),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": "Bearer k1"}, 400)],
)
def test_key_checker(headers: dict[str, str], status: int) -> None:
    server = OpenAIServer(_NoServicer(), "m", key_checker=lambda key: key == "k1")
    got, body = call(server.app(), "/v1/chat/completions", b"{broken", headers)
    assert got == status, body
    want = "authentication_error" if status == 401 else "invalid_request_error"
    assert body["error"]["type"] == want  # a good key gets as far as the JSON parser


def test_router_errors_map_to_openai_statuses() -> None:
    assert from_router_error(InvalidRequest("x")).status == 400
    assert from_router_error(Overloaded("queue full")).status == 429
    assert from_router_error(ServiceFailure("target died")).status == 503
    assert from_router_error(Overloaded("q")).body()["error"]["type"] == "rate_limit_error"


HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(
    ("body", "field", "param"),
    [
        ({"messages": HI, "max_completion_tokens": 9, "max_tokens": 9}, "max_new_tokens",
         "max_completion_tokens"),  # the one that counts
        ({"messages": HI, "max_tokens": 9}, "max_new_tokens", "max_tokens"),
        ({"messages": HI, "guided_json": {"type": "object"}}, "structured_output", "guided_json"),
        ({"messages": HI, "tools": [TOOL], "tool_choice": "required"}, "structured_output",
         "tools"),  # the tools' grammar
        ({"messages": HI}, "input", "messages"),
        ({"messages": HI}, "top_p", "top_p"),
        ({"prompt": "hi"}, "input", "prompt"),
        ({"prompt": "hi"}, "structured_output", "response_format"),
        ({"prompt": "hi"}, None, None),  # no one field: the KV pool too small for the request
    ],
)  # fmt: skip
def test_a_router_400_names_the_key_the_body_sent(body: dict, field, param) -> None:
    parsed = (parse_chat if "messages" in body else parse_completion)(body)
    err = from_router_error(InvalidRequest("bad", field), parsed.params)
    assert err.body()["error"]["param"] == param


def test_a_router_400_message_names_the_key_the_body_sent() -> None:
    """The router's messages lead with its own field names; HTTP says the client's."""
    parsed = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                         "max_completion_tokens": 5})  # fmt: skip
    refusal = InvalidRequest("max_new_tokens must be at least 1", "max_new_tokens")
    error = from_router_error(refusal, parsed.params).body()["error"]
    assert (error["message"], error["param"]) == (
        "max_completion_tokens must be at least 1", "max_completion_tokens")
    other = InvalidRequest("the prompt and max_new_tokens exceed the context", "max_new_tokens")
    assert from_router_error(other, parsed.params).body()["error"]["message"] == str(other)


def test_chat_parameters_reach_the_grpc_request() -> None:
    parsed = parse_chat({
        "model": "m", "messages": [{"role": "developer", "content": [{"type": "text",
                                                                     "text": "be brief"}]},
                                   {"role": "user", "content": "hi"}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": -1,
        "stop": "END", "stream": True, "stream_options": {"include_usage": True},
        "speculation": False, "top_k": 5,
    })
    g = parsed.generate
    assert [(m.role, m.content) for m in g.messages.items] == [("system", "be brief"),
                                                               ("user", "hi")]
    s = g.sampling
    assert (s.max_new_tokens, s.top_k, list(s.stop)) == (7, 5, ["END"])
    assert s.temperature == pytest.approx(0.5) and s.top_p == pytest.approx(0.9)
    assert s.seed == (1 << 64) - 1  # OpenAI's negative seeds wrap into uint64
    assert g.speculation.HasField("enabled") and g.speculation.enabled is False
    assert parsed.stream and parsed.include_usage


def test_a_failed_choice_ends_the_interleaved_stream_and_closes_the_others() -> None:
    from router.openai_api.choices import ChoiceFailed, interleaved

    closed: list[str] = []

    async def endless(name: str):
        try:
            while True:
                yield name
                await asyncio.sleep(0.001)
        finally:
            closed.append(name)

    async def failing():
        yield "f1"
        await asyncio.sleep(0.01)
        raise ChoiceFailed("error event")

    async def run() -> tuple[list[str], str]:
        seen = []
        try:
            async for event in interleaved([endless("a"), failing()]):
                seen.append(event)
        except ChoiceFailed as failed:
            return seen, failed.event
        return seen, ""

    seen, error = asyncio.run(run())
    assert error == "error event" and "f1" in seen and "a" in seen
    assert closed == ["a"]  # the other choice's stream was closed (its request aborted)


@pytest.mark.parametrize("role", [["user"], {"name": "user"}, 7, None])
def test_a_role_of_the_wrong_type_is_a_400_naming_it(role) -> None:
    body = json.dumps({"messages": [{"role": role, "content": "hi"}]}).encode()
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), "/v1/chat/completions", body, {})
    assert status == 400, reply  # a list or an object was unhashable: a 500 with a traceback
    assert reply["error"]["param"] == "messages[0].role"


@pytest.mark.parametrize(
    ("message", "param", "says"),
    [({"role": "user", "contents": "hi"}, "messages[1].contents", "did you mean content?"),
     ({"role": "user", "content": "hi", "name": 7}, "messages[1].name", "must be a string")],
)  # fmt: skip
def test_a_messages_unknown_key_or_bad_name_is_a_400(message, param, says) -> None:
    """``contents`` used to give an empty user message, and a reply to it."""
    body = {"messages": [{"role": "system", "content": "Be brief."}, message]}
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), "/v1/chat/completions",
                         json.dumps(body).encode(), {})  # fmt: skip
    assert status == 400 and reply["error"]["param"] == param
    assert says in reply["error"]["message"]


def test_a_messages_name_refusal_and_null_fields_are_taken() -> None:
    """What a client sends back of an earlier reply: unset fields as null, a name."""
    parsed = parse_chat({"messages": [
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "Hello", "refusal": None, "audio": None,
         "function_call": None, "tool_calls": None},
        {"role": "user", "content": "again"}]})  # fmt: skip
    contents = [m.content for m in parsed.generate.messages.items]
    assert contents == ["hi", "Hello", "again"]


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", b'{"messages": ' + DEEP + b"}"),  # RecursionError in json
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": ' + b"1" * 5000 + b"}"),
        ("/v1/completions", b'{"prompt": "hi \\ud800 there"}'),  # a lone surrogate, escaped
        ("/v1/completions", b'{"prompt": "hi", "stop": ["\\udc00"]}'),
        ("/v1/completions", b'{"prompt": "hi \xed\xa0\x80"}'),  # the same as raw UTF-8 bytes
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}'),
    ],
)
def test_json_that_python_parses_but_cannot_use_is_a_400(path: str, raw: bytes) -> None:
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), path, raw, {})
    assert status == 400, reply  # each was a 500 with a traceback
    assert reply["error"]["code"] == "invalid_json", reply


def test_a_surrogate_pair_is_one_character_and_parses() -> None:
    from router.openai_api.protocol import parse_body

    assert parse_body(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"temperature": 10**400}, "temperature"), ({"presence_penalty": -(10**400)},
     "presence_penalty"), ({"logit_bias": {"5": 10**400}}, "logit_bias")],
)  # fmt: skip
def test_an_integer_past_floats_range_is_a_400_naming_it(extra: dict, param: str) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], **extra}).encode()
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), "/v1/chat/completions", body, {})
    assert status == 400, reply  # float() raised OverflowError: a 500
    assert reply["error"]["param"] == param


class _Unanswered:
    """A submitted request that yields no item: only an abort would end it."""

    def __init__(self) -> None:
        self.request_id, self.finished, self.outbox = "r1", False, asyncio.Queue()


class _Scheduler:
    tokenizer = None

    def __init__(self) -> None:
        self.aborted: list[str] = []

    def submit(self, req: _Unanswered) -> None:
        pass

    def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True


class _Servicer:
    def __init__(self) -> None:
        self.scheduler = _Scheduler()

    async def prepare(self, generate) -> None:
        pass

    def _build(self, generate, trace_context) -> _Unanswered:
        return _Unanswered()


def test_a_client_that_leaves_before_a_whole_reply_aborts_its_request() -> None:
    servicer = _Servicer()
    body = json.dumps({"prompt": "hi", "max_tokens": 1000}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:  # the body, then the client goes away
        if messages:
            return messages.pop()
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [],
             "query_string": b"", "root_path": ""}  # fmt: skip
    app = OpenAIServer(servicer, "m").app()
    # Before, the handler waited for every token of a reply nobody would read.
    asyncio.run(asyncio.wait_for(app(scope, receive, send), timeout=2))
    assert servicer.scheduler.aborted == ["r1"]


def test_a_body_past_the_limit_is_a_413_before_it_is_read_whole() -> None:
    """Starlette reads a body whole: before, a client could make the router hold any size."""
    app = OpenAIServer(_NoServicer(), "m", max_body_bytes=100).app()
    body = json.dumps({"messages": [{"role": "user", "content": "x" * 200}]}).encode()
    for headers in ({"Content-Length": str(len(body))}, {}):  # declared, or found reading
        status, reply = call(app, "/v1/chat/completions", body, headers)
        assert status == 413 and reply["error"]["code"] == "request_too_large"
        assert "--max-http-body-bytes" in reply["error"]["message"]
        assert reply["error"]["type"] == "invalid_request_error"


def test_stream_options_without_stream_is_a_400() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream_options": {}}
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), "/v1/chat/completions",
                         json.dumps(body).encode(), {})  # fmt: skip
    assert status == 400 and reply["error"]["param"] == "stream_options"


@pytest.mark.parametrize(
    ("options", "param", "says"),
    [({"include_usgae": True}, "stream_options.include_usgae", "unrecognized stream option"),
     ({"include_usage": "yes"}, "stream_options.include_usage", "must be true or false")],
)  # fmt: skip
def test_a_stream_option_misspelt_or_not_a_bool_is_a_400(
    options: dict, param: str, says: str
) -> None:
    """Before, either was taken: the first as include_usage off, the second as on."""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": options}  # fmt: skip
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), "/v1/chat/completions",
                         json.dumps(body).encode(), {})  # fmt: skip
    assert status == 400 and reply["error"]["param"] == param
    assert says in reply["error"]["message"]


def test_a_wrong_method_is_a_405_request_error() -> None:
    status, reply = call(OpenAIServer(_NoServicer(), "m").app(), "/v1/models", b"", {}, "DELETE")
    assert status == 405 and reply["error"]["type"] == "invalid_request_error"


class _Described:
    """A servicer with the model description /v1/models reads."""

    scheduler = None

    class model_info:  # noqa: N801 (an attribute, as the servicer's)
        max_context_length = 2048


@pytest.mark.parametrize("name", ["tiny", "org/tiny-Q4_1"])  # a served name may hold a slash
def test_a_model_is_retrieved_by_its_id(name: str) -> None:
    """openai-python's client.models.retrieve: before, a 404 for the served model too."""
    app = OpenAIServer(_Described(), name).app()
    status, listed = call(app, "/v1/models", b"", {}, "GET")
    assert status == 200
    status, card = call(app, f"/v1/models/{name}", b"", {}, "GET")
    assert status == 200 and card == listed["data"][0], card
    for other in ("gpt-4o", f"{name}x", f"{name}/x", ""):
        status, reply = call(app, f"/v1/models/{other}", b"", {}, "GET")
        assert status == 404, reply
        assert reply["error"] == {
            "message": f"The model `{other}` does not exist; this server serves `{name}`",
            "type": "invalid_request_error", "param": "model", "code": "model_not_found",
        }  # fmt: skip


def test_a_model_is_retrieved_with_the_key_only() -> None:
    app = OpenAIServer(_Described(), "tiny", key_checker=lambda key: key == "k1").app()
    status, reply = call(app, "/v1/models/tiny", b"", {}, "GET")
    assert status == 401 and reply["error"]["type"] == "authentication_error"
    status, card = call(app, "/v1/models/tiny", b"", {"Authorization": "Bearer k1"}, "GET")
    assert status == 200 and card["id"] == "tiny"
