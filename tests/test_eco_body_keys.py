"""An OpenAI body's keys (router/openai_api/body_keys.py): a key the server does not take is a
400 naming it, with the key meant where one is close, never dropped; the lists of keys taken
are exactly the keys the parsers read."""

from __future__ import annotations

from typing import Any

import pytest

from router.openai_api import body_keys
from router.openai_api.errors import ApiError
from router.openai_api.protocol import parse_chat, parse_completion
from router.openai_api.tokenize import detokenize, tokenize
from tests.helpers.prompts import router_tokenizer

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"prompt": "Hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


class Reads(dict):
    """A body that notes every key a parser looks up, present or not."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _keys_read(parse, *bodies: dict) -> set[str]:
    read: set[str] = set()
    for body in bodies:
        recorded = Reads(body)
        parse(recorded)
        read |= recorded.read
    return read


def test_the_keys_taken_are_the_keys_the_parsers_read() -> None:
    """Both ways: a key read but not listed would be refused; a key listed but never read
    would be taken and ignored."""
    chat_bodies = (CHAT, {**CHAT, "tools": [TOOL]})
    assert _keys_read(parse_chat, *chat_bodies) == body_keys.CHAT - body_keys.NO_EFFECT
    assert _keys_read(parse_completion, COMPLETION) == body_keys.COMPLETIONS - body_keys.NO_EFFECT
    tok = router_tokenizer()
    read = _keys_read(lambda body: tokenize(body, tok, 8192), COMPLETION, CHAT,
                      {**CHAT, "tools": [TOOL]})  # fmt: skip
    assert read | {"model"} == body_keys.TOKENIZE  # the app checks the model before
    assert _keys_read(lambda body: detokenize(body, tok), {"tokens": [1]}) | {"model"} == (
        body_keys.DETOKENIZE
    )


@pytest.mark.parametrize(
    ("parse", "body", "key", "message"),
    [(parse_chat, {**CHAT, "max_token": 3}, "max_token",
      "unrecognized request argument: max_token (did you mean max_tokens?)"),
     (parse_completion, {**COMPLETION, "temprature": 0.5}, "temprature",
      "unrecognized request argument: temprature (did you mean temperature?)"),
     (parse_completion, {**COMPLETION, "max_completion_tokens": 3}, "max_completion_tokens",
      "max_completion_tokens is a chat completions parameter"),
     (parse_chat, {**CHAT, "echo": True}, "echo", "echo is a completions parameter"),
     (parse_chat, {**CHAT, "frobnicate": True}, "frobnicate",
      "unrecognized request argument: frobnicate"),
     (parse_chat, {**CHAT, "reasoning_effort": "low"}, "reasoning_effort",
      "reasoning_effort is not supported"),
     (parse_chat, {**CHAT, "modalities": ["text", "audio"]}, "modalities",
      "modalities is not supported"),
     (lambda body: tokenize(body, router_tokenizer(), 8192),
      {**COMPLETION, "return_token_strs": True}, "return_token_strs",
      "unrecognized request argument: return_token_strs"),
     (lambda body: detokenize(body, router_tokenizer()), {"tokens": [1], "prompt": "x"},
      "prompt", "prompt is a completions parameter")],
)  # fmt: skip
def test_a_key_not_taken_is_a_400_naming_it(parse, body: dict, key: str, message: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse(body)
    assert (refused.value.status, refused.value.param, refused.value.message) == (400, key, message)


@pytest.mark.parametrize(
    "extra",
    [{"user": "u-1", "store": False, "metadata": {"a": "b"}, "service_tier": "auto",
      "prompt_cache_key": "k", "safety_identifier": "s", "prediction": {"type": "content"}},
     {"max_token": None, "reasoning_effort": None}, {"modalities": ["text"]}],
)  # fmt: skip
def test_keys_that_change_nothing_and_nulls_are_taken(extra: dict) -> None:
    for parse, body in ((parse_chat, CHAT), (parse_completion, COMPLETION)):
        assert parse({**body, **extra}).generate == parse(body).generate
