"""Bad HTTP input gets OpenAI's error shape and status, and the server keeps serving; a client
that leaves a stream early frees its request."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from tests.helpers.eco_stack import EcoStack
from tests.helpers.rpc import assert_slots_accounted

pytestmark = pytest.mark.slow


def chat_body(eco: EcoStack, **extra) -> dict:
    return {"model": eco.model_name, "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4, "temperature": 0, **extra}


def assert_error(status: int, body: dict, want_status: int, param: str | None = None) -> None:
    assert status == want_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and isinstance(error["type"], str)
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize(
    ("extra", "status", "param"),
    [
        ({"model": "gpt-4o"}, 404, "model"),
        ({"model": ""}, 400, "model"),
        ({"model": 7}, 400, "model"),
        ({"n": 65}, 400, "n"),
        ({"best_of": 2}, 400, "best_of"),  # a completions parameter: chat has none
        ({"max_tokens": -1}, 400, "max_tokens"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_completion_tokens": "8"}, 400, "max_completion_tokens"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
        ({"stop": 7}, 400, "stop"),
        ({"top_logprobs": 3}, 400, "top_logprobs"),  # needs logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        ({"logprobs": 1}, 400, "logprobs"),  # a bool in chat
        ({"temperature": -1}, 400, "temperature"),  # refused by the router's own validation
        ({"presence_penalty": 2.5}, 400, "presence_penalty"),
        ({"min_p": 1.5}, 400, "min_p"),
        ({"repetition_penalty": 0}, 400, "repetition_penalty"),
        ({"repetition_penalty": "high"}, 400, "repetition_penalty"),
        ({"min_tokens": -1}, 400, "min_tokens"),
        ({"min_tokens": 5}, 400, "min_tokens"),  # over max_tokens 4
        ({"max_tokens": 10**9}, 400, "max_tokens"),  # over --max-new-tokens-limit
    ],
)
def test_bad_chat_requests(eco_stack: EcoStack, extra: dict, status: int, param) -> None:
    got_status, body = eco_stack.post("/v1/chat/completions", chat_body(eco_stack, **extra))
    assert_error(got_status, body, status, param)
    if status == 404:
        assert body["error"]["code"] == "model_not_found"


PAST_MAX_TEXT_CHARS = "x" * (256 * 1024 + 1)  # the router's --max-text-chars, by default


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"top_p": 0}, "top_p"),
        ("/v1/chat/completions", {"top_k": -2}, "top_k"),
        ("/v1/chat/completions", {"frequency_penalty": -3}, "frequency_penalty"),
        ("/v1/chat/completions", {"max_completion_tokens": 10**9}, "max_completion_tokens"),
        ("/v1/chat/completions", {"stop": ["a"] * 17}, "stop"),
        ("/v1/chat/completions", {"stop": [""]}, "stop"),
        ("/v1/chat/completions", {"stop": "s" * 257}, "stop"),
        ("/v1/chat/completions", {"stop_token_ids": [10**9]}, "stop_token_ids"),
        ("/v1/chat/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("/v1/chat/completions", {"guided_regex": "(("}, "guided_regex"),  # does not compile
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "ignore_eos": True},
         "response_format"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": PAST_MAX_TEXT_CHARS}]},
         "messages"),
        ("/v1/completions", {"prompt": PAST_MAX_TEXT_CHARS}, "prompt"),
        ("/v1/completions", {"prompt": [10**9]}, "prompt"),  # a token id past the vocabulary
        ("/v1/completions", {"max_tokens": 10**9}, "max_tokens"),
        ("/v1/completions", {"temperature": -0.5}, "temperature"),
    ],
)  # fmt: skip
def test_a_400_of_the_routers_validation_names_the_param(
    eco_stack: EcoStack, path: str, extra: dict, param: str
) -> None:
    """These pass the HTTP parser and are refused by the gRPC API's validation: their param was
    null, though OpenAI names the body's key at fault."""
    body = chat_body(eco_stack, **extra)
    if path == "/v1/completions":
        body = {"model": eco_stack.model_name, "prompt": "Hi", "max_tokens": 4, **extra}
    assert_error(*eco_stack.post(path, body), 400, param)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_malformed_bodies(eco_stack: EcoStack, raw: bytes) -> None:
    status, body = eco_stack.post("/v1/completions", raw)
    assert_error(status, body, 400)
    assert body["error"]["type"] == "invalid_request_error"


def test_unknown_path_and_bad_prompt(eco_stack: EcoStack) -> None:
    status, raw = eco_stack.get("/v1/engines")
    assert_error(status, json.loads(raw), 404)
    body = {"model": eco_stack.model_name, "prompt": ["a", 5], "max_tokens": 2}  # mixed
    assert_error(*eco_stack.post("/v1/completions", body), 400, "prompt")


def test_a_request_naming_no_model_gets_the_served_one(eco_stack: EcoStack) -> None:
    body = {"prompt": "The sky is", "max_tokens": 3, "temperature": 0}  # vLLM takes this too
    status, reply = eco_stack.post("/v1/completions", body)
    assert status == 200, reply
    assert reply["model"] == eco_stack.model_name and reply["usage"]["completion_tokens"] == 3


def test_still_serving_after_bad_input(eco_stack: EcoStack) -> None:
    status, body = eco_stack.post("/v1/chat/completions", chat_body(eco_stack))
    assert status == 200, body
    assert body["usage"]["completion_tokens"] >= 1
    status, raw = eco_stack.get("/health")
    assert status == 200 and json.loads(raw) == {"status": "ok"}
    assert_slots_accounted(eco_stack.router.wait_idle())


def test_client_leaving_a_stream_frees_its_request(eco_stack: EcoStack) -> None:
    before = eco_stack.router.status().num_generated_tokens
    host, port = eco_stack.stack.http_address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = chat_body(eco_stack, max_tokens=400, stream=True, ignore_eos=True)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    reply = conn.getresponse()
    assert reply.status == 200
    assert reply.readline().startswith(b"data: ")  # the stream has started
    conn.close()  # leave long before 400 tokens
    status = eco_stack.router.wait_idle(timeout_s=30)
    assert_slots_accounted(status)
    generated = status.num_generated_tokens - before
    assert 1 <= generated < 200, f"{generated} tokens: the request ran on after the client left"


def test_client_leaving_before_a_whole_reply_frees_its_request(eco_stack: EcoStack) -> None:
    before = eco_stack.router.status().num_generated_tokens
    host, port = eco_stack.stack.http_address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = chat_body(eco_stack, max_tokens=400, ignore_eos=True)  # not streamed
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    _wait_for_tokens(eco_stack, before)  # the request runs
    conn.close()  # leave long before 400 tokens: uvicorn tells the app the client is gone
    status = eco_stack.router.wait_idle(timeout_s=30)
    assert_slots_accounted(status)
    generated = status.num_generated_tokens - before
    assert 1 <= generated < 200, f"{generated} tokens: the request ran on after the client left"


def _wait_for_tokens(eco_stack: EcoStack, before: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while eco_stack.router.status().num_generated_tokens == before:
        assert time.monotonic() < deadline, "the request generated nothing"
        time.sleep(0.02)
