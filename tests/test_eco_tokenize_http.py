"""vLLM's tokenizer endpoints (router/openai_api/tokenize.py) on the router's real tokenizer:
/tokenize, /detokenize and /tokenizer_info answer as lm-evaluation-harness's remote tokenizer
reads them, bad bodies get a 400 naming the field, and the key check guards them. The app runs
in-process over the GGUF's tokenizer; one test goes through the live stack's HTTP port."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from router.openai_api.app import OpenAIServer
from tests.helpers.eco_stack import EcoStack
from tests.helpers.prompts import chat_ids, router_tokenizer
from tests.test_eco_http_unit import call

TEXT = "Tokenizers split text, and 2 + 2 = 4."
MAX_LEN = 8192


@pytest.fixture(scope="module")
def app():
    servicer = SimpleNamespace(scheduler=SimpleNamespace(tokenizer=router_tokenizer()),
                               model_info=SimpleNamespace(max_context_length=MAX_LEN))  # fmt: skip
    return OpenAIServer(servicer, "m", key_checker=lambda key: key == "k").app()


def post(app, path: str, body: dict, key: str = "k") -> tuple[int, dict]:
    return call(app, path, json.dumps(body).encode(), {"Authorization": f"Bearer {key}"})


def test_tokenize_and_detokenize_round_trip(app) -> None:
    tok = router_tokenizer()
    status, body = post(app, "/tokenize", {"prompt": TEXT, "add_special_tokens": False})
    assert status == 200 and body["tokens"] == tok.encode(TEXT, add_special_tokens=False)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == MAX_LEN
    status, back = post(app, "/detokenize", {"tokens": body["tokens"]})
    assert (status, back) == (200, {"prompt": TEXT})
    chat = [{"role": "user", "content": "Hi there"}]
    status, body = post(app, "/tokenize", {"messages": chat})
    assert status == 200 and body["tokens"] == list(chat_ids(chat))


def test_tokenizer_info_spells_tokens_that_tokenize_back(app) -> None:
    tok = router_tokenizer()
    status, info = call(app, "/tokenizer_info", b"", {"Authorization": "Bearer k"}, "GET")
    assert status == 200 and info["model_max_length"] == MAX_LEN
    assert info["chat_template"] == tok.chat_template and "im_start" in info["chat_template"]
    _, body = post(app, "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
    assert body["tokens"] == [tok.eos_token_ids[0]]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "b"}]}, "messages[0].role"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
    ],
)
def test_bad_bodies_name_their_field(app, path: str, body: dict, param: str) -> None:
    status, reply = post(app, path, body)
    assert status == 400 and reply["error"]["param"] == param, reply


def test_the_key_check_guards_them(app) -> None:
    status, reply = post(app, "/tokenize", {"prompt": TEXT}, key="wrong")
    assert status == 401 and reply["error"]["type"] == "authentication_error"


@pytest.mark.slow
def test_the_live_router_serves_them(eco_stack: EcoStack) -> None:
    status, body = eco_stack.post("/tokenize", {"prompt": TEXT})
    assert status == 200 and body["tokens"] == router_tokenizer().encode(TEXT)
    status, raw = eco_stack.get("/tokenizer_info")
    assert status == 200 and json.loads(raw)["eos_token"] == "<|im_end|>"


def test_another_models_name_is_a_404_as_in_vllm(app) -> None:
    """Before, /tokenize and /detokenize answered for any model name, with this tokenizer."""
    for path, body in (("/tokenize", {"prompt": TEXT}), ("/detokenize", {"tokens": [1, 2]})):
        status, reply = post(app, path, {**body, "model": "gpt-4"})
        assert status == 404 and reply["error"]["code"] == "model_not_found", reply
        assert post(app, path, {**body, "model": "m"})[0] == 200
