"""`splitspec bench`'s figures: one arm's summary from its samples, and the printed table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def arm_summary(samples: Sequence[Any]) -> dict[str, Any]:
    """Throughput over the arm's own waves (each from its first request's send to its last
    one's end; an open loop is one wave), the latency percentiles of its requests, and its
    acceptance (committed tokens a verify step, the bonus token included, as GetServerStatus
    counts it)."""
    done = [s for s in samples if not s.error]
    tokens = sum(len(s.token_ids) for s in done)
    seconds = sum(_wave_seconds(done).values())
    steps = sum(s.verify_steps for s in done)
    accepted = sum(s.accepted_tokens for s in done)
    return {
        "requests": len(samples),
        "failed": len(samples) - len(done),
        "output_tokens": tokens,
        "seconds": seconds,
        "output_tokens_per_s": tokens / seconds if seconds else 0.0,
        "ttft_ms": _percentiles([s.ttft_s * 1e3 for s in done if s.token_ids]),
        "tpot_ms": _percentiles([_tpot_ms(s) for s in done if len(s.token_ids) > 1]),
        "e2e_ms": _percentiles([s.seconds * 1e3 for s in done]),
        "prompt_tokens": sum(s.prompt_tokens for s in done),
        "cached_prompt_tokens": sum(s.cached_tokens for s in done),
        "verify_steps": steps,
        "draft_tokens": sum(s.draft_tokens for s in done),
        "accepted_tokens": accepted,
        "mean_acceptance_length": (accepted + steps) / steps if steps else 0.0,
        "errors": sorted({s.error for s in samples if s.error}),
    }


def _wave_seconds(samples: Sequence[Any]) -> dict[int, float]:
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for s in samples:
        first[s.wave] = min(first.get(s.wave, s.sent_s), s.sent_s)
        last[s.wave] = max(last.get(s.wave, 0.0), s.sent_s + s.seconds)
    return {wave: last[wave] - first[wave] for wave in first}


def _tpot_ms(sample: Any) -> float:
    """Time per output token after the first."""
    return (sample.seconds - sample.ttft_s) * 1e3 / (len(sample.token_ids) - 1)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]  # noqa: E731
    return {"mean": sum(ordered) / len(ordered), "p50": pick(0.5), "p90": pick(0.9),
            "p99": pick(0.99)}  # fmt: skip


def print_report(record: dict[str, Any], source: str) -> None:
    s = record["settings"]
    mode = "greedy" if s["temperature"] == 0 else f"temperature {s['temperature']}"
    print(
        f"splitspec bench: {record['num_prompts']} prompts ({source}), up to "
        f"{s['max_new_tokens']} new tokens, {_load(s)}, {mode}, "
        f"router {record['router']}"
    )
    header = ("arm", "requests", "tokens", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
              "acceptance")  # fmt: skip
    rows = [header] + [_row(arm, a) for arm, a in record["arms"].items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for arm, a in record["arms"].items():
        for error in a["errors"]:
            print(f"{arm}: failed: {error}")
    if "comparison" in record:
        print(_comparison_line(record["comparison"]))
        which = "every prompt was" if s.get("request_rate") else "each wave's prompts were"
        print(f"({which} prefilled once before the arms ran: both arms' TTFT is a cached "
              "prompt's)")


def _load(settings: dict[str, Any]) -> str:
    rate, cap = settings.get("request_rate"), settings["concurrency"]
    if rate is None:
        return f"concurrency {cap}"
    return f"Poisson arrivals {rate:g}/s" + (f", at most {cap} in flight" if cap else "")


def _row(arm: str, a: dict[str, Any]) -> tuple[str, ...]:
    pair = lambda p: f"{p.get('p50', 0):.0f} / {p.get('p99', 0):.0f}"  # noqa: E731
    acceptance = f"{a['mean_acceptance_length']:.2f}" if a["verify_steps"] else "-"
    requests = f"{a['requests']}" + (f" ({a['failed']} failed)" if a["failed"] else "")
    return (arm, requests, str(a["output_tokens"]), f"{a['output_tokens_per_s']:.1f}",
            pair(a["ttft_ms"]), pair(a["tpot_ms"]), acceptance)  # fmt: skip


def _comparison_line(comparison: dict[str, Any]) -> str:
    line = (
        f"speculative / target-only: {comparison['speedup']:.2f}x output tokens/s, "
        f"{comparison['mean_request_time_ratio']:.2f}x mean request time"
    )
    if "outputs_compared" in comparison:
        line += f"; outputs equal: {comparison['outputs_equal']}/{comparison['outputs_compared']}"
    return line
