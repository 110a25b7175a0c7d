"""The last streamed item of a request: finish reason, usage, timings and speculation totals."""

from __future__ import annotations

from protos import generation_pb2 as pb
from router.request import Request
from router.stats import speculation_stats


def fill_final(
    item: pb.GenerateResponse, req: Request, reason: pb.FinishReason, matched: str, now: float
) -> None:
    item.finish_reason = reason
    item.matched_stop = matched
    item.usage.CopyFrom(
        pb.Usage(
            prompt_tokens=req.prompt_len,
            completion_tokens=len(req.output_ids),
            cached_tokens=req.prompt_cached_len,
        )
    )
    started = req.first_scheduled or now
    item.timings.CopyFrom(
        pb.Timings(
            queue_ms=(started - req.arrival) * 1e3,
            time_to_first_token_ms=((req.first_token or now) - req.arrival) * 1e3,
            total_ms=(now - req.arrival) * 1e3,
        )
    )
    if req.verify_steps:
        item.speculation.CopyFrom(
            speculation_stats(
                req.verify_steps, req.draft_tokens, req.accepted_tokens, req.forced_tokens
            )
        )
