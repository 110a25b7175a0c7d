"""The top-level keys an OpenAI (or vLLM tokenizer) body may hold; any other is refused, never
ignored.

A mistyped key (``max_token``, ``temprature``) used to be dropped without a word: the reply
then ran to the default length, greedy, and looked like the server's fault. OpenAI answers such
a key with a 400, and so does this server, naming the key and, when one is close, the key
meant. A null value counts as absent (clients send unset fields as null). OpenAI's parameters
that change nothing the server generates (``user``, ``store``, ``metadata``...) are taken and
ignored; those that would change the output and are not served (``reasoning_effort``,
``audio``...) are refused as not supported. vLLM's extras that are served are listed with the
rest; its others are unknown here.
"""

from __future__ import annotations

import difflib
from typing import Any

from router.openai_api.errors import ApiError

_SAMPLING = {
    "model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p", "seed",
    "presence_penalty", "frequency_penalty", "stop", "logit_bias", "logprobs",
    # vLLM's extras (router/openai_api/vllm_sampling.py, formats.py)
    "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos",
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar",
    "speculation",  # this server's own: speculative decoding on or off for the request
}  # fmt: skip
# Taken and ignored: they change nothing about what is generated. ``prediction`` (predicted
# output) only lets a server go faster, which speculation here does anyway.
NO_EFFECT = {"user", "store", "metadata", "service_tier", "prompt_cache_key",
             "safety_identifier", "prediction"}  # fmt: skip
CHAT = _SAMPLING | NO_EFFECT | {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "functions", "function_call", "best_of",  # the last three refused
}  # fmt: skip
COMPLETIONS = _SAMPLING | NO_EFFECT | {
    "prompt", "echo", "best_of", "suffix", "tools", "functions",  # suffix and tools refused
}  # fmt: skip
# vLLM's tokenizer endpoints (router/openai_api/tokenize.py; ``model`` is the app's check).
TOKENIZE = {"model", "prompt", "add_special_tokens", "messages", "tools", "tool_choice",
            "parallel_tool_calls", "functions", "function_call"}  # fmt: skip
DETOKENIZE = {"model", "tokens"}
# OpenAI's own parameters that would change the output and are not served.
NOT_SERVED = {"audio", "modalities", "reasoning_effort", "verbosity", "web_search_options"}


KEYS = {"chat completions": CHAT, "completions": COMPLETIONS, "tokenize": TOKENIZE,
        "detokenize": DETOKENIZE}  # fmt: skip


def refuse_unknown_keys(body: dict[str, Any], endpoint: str) -> None:
    """A 400 for the first key of ``body`` (in its order) that ``endpoint`` does not take."""
    known = KEYS[endpoint]
    for key, value in body.items():
        if key in known or value is None or (key == "modalities" and value == ["text"]):
            continue  # text out is what every reply here is
        if key in NOT_SERVED:
            raise ApiError(400, f"{key} is not supported", key, code="unsupported_parameter")
        elsewhere = [name for name, keys in KEYS.items() if key in keys - NO_EFFECT]
        if elsewhere:
            raise ApiError(400, f"{key} is a {elsewhere[0]} parameter", key,
                           code="unrecognized_argument")  # fmt: skip
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        meant = f" (did you mean {close[0]}?)" if close else ""
        raise ApiError(400, f"unrecognized request argument: {key}{meant}", key,
                       code="unrecognized_argument")  # fmt: skip
