"""vLLM's tokenizer endpoints beside the OpenAI ones, on the router's own tokenizer (the
GGUF's): ``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info``. A client can
count or score tokens without a tokenizer of its own: lm-evaluation-harness's
``tokenizer_backend=remote`` uses exactly these three. Bad bodies get a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from protos import generation_pb2 as pb
from router.chat_input import template_input
from router.openai_api.body_keys import refuse_unknown_keys
from router.openai_api.errors import ApiError
from router.openai_api.messages import chat_message
from router.openai_api.sampling import flag
from router.openai_api.tools import apply_tools, parse_tools
from router.tokenizer import Tokenizer


def tokenize(body: dict[str, Any], tokenizer: Tokenizer, max_model_len: int) -> dict[str, Any]:
    """``prompt`` (a string; ``add_special_tokens``, default true) or ``messages`` (a chat,
    templated as the chat API templates it, ``tools`` included) as token ids."""
    refuse_unknown_keys(body, "tokenize")
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise ApiError(400, "give either prompt (a string) or messages (a chat)", "prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be a string", "prompt")
        add_special = flag(body, "add_special_tokens") if "add_special_tokens" in body else True
        tokens = tokenizer.encode(prompt, add_special_tokens=add_special)
    else:
        tokens = _chat_tokens(body, tokenizer)
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens}


def detokenize(body: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    refuse_unknown_keys(body, "detokenize")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and tokenizer.is_valid_id(t) for t in tokens
    ):
        raise ApiError(
            400, f"tokens must be a list of token ids in [0, {tokenizer.vocab_size})", "tokens"
        )
    return {"prompt": tokenizer.decode(tokens)}


def tokenizer_info(tokenizer: Tokenizer, max_model_len: int) -> dict[str, Any]:
    """What a remote client needs to stand in for the tokenizer: its special tokens' text (each
    tokenizes back to its id) and the chat template's source."""
    eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
    return {
        "tokenizer_class": "splitspec GGUF tokenizer",
        "model": tokenizer.model_name,
        "vocab_size": tokenizer.vocab_size,
        "model_max_length": max_model_len,
        "eos_token": _spelled(tokenizer, eos),
        "bos_token": _spelled(tokenizer, tokenizer.bos_token_id),
        "pad_token": None,
        "chat_template": tokenizer.chat_template,
    }


def _chat_tokens(body: dict[str, Any], tokenizer: Tokenizer) -> list[int]:
    """A chat's prompt ids as the chat API builds them, with its tools (and tool_choice)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    request = pb.GenerateRequest()
    for i, message in enumerate(messages):
        request.messages.items.append(chat_message(message, f"messages[{i}]"))
    tools = parse_tools(body)
    if tools is not None:
        apply_tools(request, tools)
    try:
        chat = template_input(request.messages)
        return tokenizer.apply_chat_template(chat.messages, chat.tools)
    except ValueError as err:
        raise ApiError(400, str(err), "messages") from err


def _spelled(tokenizer: Tokenizer, token_id: int | None) -> str | None:
    return None if token_id is None else tokenizer.decode([token_id])
