"""Writes splitspec.json, the Grafana dashboard over the router's /metrics.

Run `python deploy/grafana/build_dashboard.py` after changing a panel here; the JSON is
committed so that it can be imported (Dashboards > Import) without running anything.
tests/test_eco_metrics.py checks that every query names a metric the router exports.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("splitspec.json")
R = "[$__rate_interval]"


def quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le{', ' + by if by else ''}"
    label = f"{{{{{by}}}}} " if by else ""
    return [
        (f"histogram_quantile({q}, sum by ({group}) (rate(splitspec:{metric}_bucket{R})))",
         f"{label}p{int(q * 100)}")
        for q in (0.5, 0.99)
    ]


PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Requests running / waiting", "short", [
        ("splitspec:num_requests_running", "running"),
        ("splitspec:num_requests_waiting", "waiting"),
    ]),
    ("Finished requests / s", "reqps", [
        (f"sum by (finished_reason) (rate(splitspec:request_success_total{R}))",
         "{{finished_reason}}"),
    ]),
    ("Tokens / s", "short", [
        (f"rate(splitspec:prompt_tokens_total{R})", "prompt"),
        (f"rate(splitspec:generation_tokens_total{R})", "generated"),
    ]),
    ("Time to first token", "s", quantiles("time_to_first_token_seconds")),
    ("Inter-token latency", "s", quantiles("inter_token_latency_seconds")),
    ("End-to-end latency", "s", quantiles("e2e_request_latency_seconds")),
    ("Queue time", "s", quantiles("request_queue_time_seconds")),
    ("Acceptance length (tokens per verify step)", "short", [
        (f"1 + rate(splitspec:spec_decode_num_accepted_tokens_total{R}) / "
         f"rate(splitspec:spec_decode_num_drafts_total{R})", "accept length"),
    ]),
    ("Draft acceptance rate", "percentunit", [
        (f"rate(splitspec:spec_decode_num_accepted_tokens_total{R}) / "
         f"rate(splitspec:spec_decode_num_draft_tokens_total{R})", "accepted / drafted"),
    ]),
    ("Accepted drafts by position", "short", [
        (f"sum by (position) (rate(splitspec:spec_decode_num_accepted_tokens_per_pos_total{R}))",
         "position {{position}}"),
    ]),
    ("Speculation switch: each batch bucket's rate by mode", "short", [
        ("splitspec:spec_switch_tokens_per_second", "batch {{batch_size}} {{mode}}"),
    ]),
    ("Speculation switch: buckets speculating (1), prefill holds / s", "short", [
        ("splitspec:spec_switch_speculating", "batch {{batch_size}}"),
        (f"rate(splitspec:spec_switch_prefill_holds_total{R})", "prefill holds"),
    ]),
    ("Draft RPC latency", "s", quantiles("draft_rpc_latency_seconds", "method")),
    ("Draft replicas healthy / failures", "short", [
        ("splitspec:draft_replicas_healthy", "healthy"),
        (f"sum by (replica) (increase(splitspec:draft_unavailable_total{R}))",
         "failed {{replica}}"),
    ]),
    ("Target device time per call", "s", quantiles("target_step_device_seconds", "method")),
    ("Target serving (1) or lost (0)", "short", [("splitspec:target_serving", "serving")]),
    ("KV slots in use", "percentunit", [("splitspec:kv_cache_usage_perc", "KV usage")]),
    ("Radix cache hit rate", "percentunit", [
        (f"rate(splitspec:prefix_cache_hits_total{R}) / "
         f"rate(splitspec:prefix_cache_queries_total{R})", "hit rate"),
    ]),
    ("Structured output: requests / s by format, forced draft tokens / s", "short", [
        (f"sum by (format) (rate(splitspec:structured_output_requests_total{R}))", "{{format}}"),
        (f"sum by (format) (rate(splitspec:structured_output_refused_total{R}))",
         "refused {{format}}"),
        (f"rate(splitspec:spec_decode_num_forced_tokens_total{R})", "forced tokens"),
    ]),
    ("Format compile time, cache hit rate", "s", [
        *quantiles("structured_output_compile_seconds"),
        (f"rate(splitspec:structured_output_cache_hits_total{R}) / "
         f"rate(splitspec:structured_output_cache_queries_total{R})", "cache hit rate"),
    ]),
    ("Tool calling: requests / s by tool_choice, calls / s", "reqps", [
        (f"sum by (tool_choice) (rate(splitspec:tool_call_requests_total{R}))",
         "{{tool_choice}}"),
        (f"rate(splitspec:tool_calls_total{R})", "calls made"),
    ]),
]


def panel(index: int, title: str, unit: str, queries: list[tuple[str, str]]) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": (index % 3) * 8, "y": (index // 3) * 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(queries)
        ],
    }


def dashboard() -> dict:
    return {
        "title": "splitspec",
        "uid": "splitspec-router",
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Source"}
        ]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT} ({len(PANELS)} panels)")
