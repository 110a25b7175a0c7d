"""`--log-requests`: one log line when a request ends (an access log), with its id, token
counts, finish reason, timings and speculation; with `--log-format json` each is a field. A
request a server error ended (the target lost, a failed step) gets a warning with the error."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from protos import generation_pb2 as pb
from router.telemetry import Observer

log = logging.getLogger("splitspec.requests")


def add_flag(group: argparse._ActionsContainer) -> None:
    """--log-requests, on the router and on `splitspec serve` (which passes it on)."""
    group.add_argument(
        "--log-requests",
        action="store_true",
        help="a line per finished request: id, finish reason, tokens, queue time, TTFT, total "
        "time, acceptance (json fields with --log-format json)",
    )


class RequestLog(Observer):
    def request_finished(self, req: Any, reason: int, now: float) -> None:
        fields = request_fields(req, reason, now)
        log.info(
            "request %s finished (%s): %d prompt tokens (%d cached), %d generated, "
            "TTFT %.1f ms, %.1f ms in all",
            fields["request_id"], fields["finish_reason"], fields["prompt_tokens"],
            fields["cached_tokens"], fields["completion_tokens"], fields["ttft_ms"],
            fields["total_ms"], extra=fields,
        )  # fmt: skip


    def request_failed(self, req: Any, message: str, now: float) -> None:
        fields = request_fields(req, pb.FINISH_REASON_ABORT, now)
        fields["error"] = message
        log.warning(
            "request %s failed after %d generated tokens, %.1f ms: %s",
            req.request_id, fields["completion_tokens"], fields["total_ms"], message,
            extra=fields,
        )  # fmt: skip


def request_fields(req: Any, reason: int, now: float) -> dict[str, Any]:
    """What the line says, by name (plumbing/logs.EXTRA_FIELDS)."""
    started = req.first_scheduled or now
    fields = {
        "request_id": req.request_id,
        "finish_reason": pb.FinishReason.Name(reason).removeprefix("FINISH_REASON_").lower(),
        "prompt_tokens": req.prompt_len,
        "cached_tokens": req.prompt_cached_len,
        "completion_tokens": len(req.output_ids),
        "queue_ms": round((started - req.arrival) * 1e3, 2),
        "ttft_ms": round(((req.first_token or now) - req.arrival) * 1e3, 2),
        "total_ms": round((now - req.arrival) * 1e3, 2),
    }
    if req.verify_steps:  # committed tokens per verify step: the accepted drafts + the bonus
        fields["verify_steps"] = req.verify_steps
        fields["acceptance_length"] = round(
            (req.accepted_tokens + req.verify_steps) / req.verify_steps, 3
        )
    return fields
