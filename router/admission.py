"""Admission: what a request may cost before the router spends anything on it.

Checks run in order of cost: the queue first (a full queue answers RESOURCE_EXHAUSTED before
any tokenizing), then the sizes of the raw fields, then the prompt's token count. The whole
message is bounded by gRPC itself (``max_request_bytes``: larger messages end
RESOURCE_EXHAUSTED without being parsed).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from protos import generation_pb2 as pb
from router.errors import InvalidRequest


@dataclass(frozen=True)
class AdmissionLimits:
    max_request_bytes: int = 1 << 20  # one serialized GenerateRequest
    max_prompt_tokens: int = 0  # 0: the target's context decides alone
    max_text_chars: int = 256 * 1024  # text, or all message contents together
    max_messages: int = 256
    max_stop_chars: int = 256  # per stop string
    max_stop_token_ids: int = 64
    max_request_id_chars: int = 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("admission limits")
    d = AdmissionLimits()
    group.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes,
                       help="largest serialized request; larger: RESOURCE_EXHAUSTED")
    group.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens,
                       help="longest prompt in tokens (0: what the context holds)")
    group.add_argument(
        "--max-text-chars",
        type=int,
        default=d.max_text_chars,
        help="a prompt's characters at most (a chat's messages and tool definitions together); "
        "longer: INVALID_ARGUMENT",
    )
    group.add_argument(
        "--max-stop-chars", type=int, default=d.max_stop_chars, help="characters per stop string"
    )


def limits_from_args(args: argparse.Namespace) -> AdmissionLimits:
    limits = AdmissionLimits(
        max_request_bytes=args.max_request_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_text_chars=args.max_text_chars,
        max_stop_chars=args.max_stop_chars,
    )
    if min(limits.max_request_bytes, limits.max_text_chars, limits.max_stop_chars) <= 0:
        raise SystemExit("admission limits must be positive")
    if limits.max_prompt_tokens < 0:
        raise SystemExit("--max-prompt-tokens must be >= 0")
    return limits


def check_fields(request: pb.GenerateRequest, limits: AdmissionLimits) -> None:
    """Raw sizes, before tokenizing: raises InvalidRequest saying which limit was passed."""
    rid = request.request_id
    if len(rid) > limits.max_request_id_chars or not rid.isprintable():
        raise InvalidRequest(
            f"request_id must be at most {limits.max_request_id_chars} printable characters",
            "request_id",
        )
    kind = request.WhichOneof("input")
    if kind == "text":
        chars = len(request.text)
    elif kind == "messages":
        items = request.messages.items
        if len(items) > limits.max_messages:
            raise InvalidRequest(f"{len(items)} messages; at most {limits.max_messages}", "input")
        chars = len(request.messages.tools) + sum(_message_chars(m) for m in items)
    else:
        chars = 0
    if chars > limits.max_text_chars:
        raise InvalidRequest(
            f"input has {chars} characters; at most {limits.max_text_chars}", "input"
        )
    s = request.sampling
    if any(len(x) > limits.max_stop_chars for x in s.stop):
        raise InvalidRequest(
            f"a stop string may have at most {limits.max_stop_chars} characters", "stop"
        )
    if len(s.stop_token_ids) > limits.max_stop_token_ids:
        raise InvalidRequest(
            f"stop_token_ids takes at most {limits.max_stop_token_ids} ids", "stop_token_ids"
        )


def _message_chars(message: pb.ChatMessage) -> int:
    calls = sum(len(c.id) + len(c.name) + len(c.arguments) for c in message.tool_calls)
    return len(message.role) + len(message.content) + len(message.tool_call_id) + calls


def check_prompt_len(num_tokens: int, limits: AdmissionLimits) -> None:
    if limits.max_prompt_tokens and num_tokens > limits.max_prompt_tokens:
        raise InvalidRequest(
            f"prompt has {num_tokens} tokens; this server takes at most {limits.max_prompt_tokens}",
            "input",
        )


def public_server_options(
    server_options: list[tuple[str, int]], limits: AdmissionLimits
) -> list[tuple[str, int]]:
    """The internal services' server options with the public API's own receive limit."""
    rest = [(k, v) for k, v in server_options if k != "grpc.max_receive_message_length"]
    return [*rest, ("grpc.max_receive_message_length", limits.max_request_bytes)]
