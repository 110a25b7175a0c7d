"""/metrics: Prometheus text that prometheus-client's parser reads, with counters that add up
to exactly what a known workload was told in its replies; the Grafana dashboard's queries name
only metrics the router exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from protos import generation_pb2 as pb
from tests.helpers.eco_stack import EcoStack

pytestmark = pytest.mark.slow
DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "splitspec.json"
PROMPTS = ["Write a haiku about gRPC.", "List the planets of the solar system.",
           "def fibonacci(n):"]


def scrape(eco: EcoStack) -> dict[str, float]:
    """Every sample, keyed by name and sorted labels; model_name must be on all of them."""
    status, raw = eco.get("/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(raw.decode()):
        for s in family.samples:
            labels = dict(s.labels)
            if s.name.startswith("splitspec:"):
                assert labels.pop("model_name") == eco.model_name, s
            key = s.name + json.dumps(labels, sort_keys=True) if labels else s.name
            samples[key] = s.value
    return samples


def total(samples: dict[str, float], name: str) -> float:
    """Sum over a metric's label sets (e.g. every finished_reason)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def workload(eco: EcoStack) -> list[dict]:
    """Two gRPC and two HTTP requests, one after another; returns each reply's usage."""
    usages = []
    for text in PROMPTS[:2]:
        request = pb.GenerateRequest(text=text)
        request.sampling.max_new_tokens = 12
        request.sampling.temperature = 0.0
        final = eco.router.generate(request).final
        spec = final.speculation
        usages.append({"prompt": final.usage.prompt_tokens, "completion":
                       final.usage.completion_tokens, "cached": final.usage.cached_tokens,
                       "steps": spec.verify_steps, "drafts": spec.draft_tokens,
                       "accepted": spec.accepted_tokens})
    for text in PROMPTS[1:]:
        status, body = eco.post("/v1/completions", {"model": eco.model_name, "prompt": text,
                                                    "max_tokens": 12, "temperature": 0})
        assert status == 200, body
        u, spec = body["usage"], body["usage"]["speculation"] or {}
        usages.append({"prompt": u["prompt_tokens"], "completion": u["completion_tokens"],
                       "cached": u["prompt_tokens_details"]["cached_tokens"],
                       "steps": spec.get("verify_steps", 0), "drafts": spec.get("draft_tokens", 0),
                       "accepted": spec.get("accepted_tokens", 0)})
    return usages


def test_counters_equal_the_workload(eco_stack: EcoStack) -> None:
    eco_stack.router.wait_idle()
    before = scrape(eco_stack)
    usages = workload(eco_stack)
    eco_stack.router.wait_idle()
    after = scrape(eco_stack)

    def delta(name: str) -> float:
        return total(after, name) - total(before, name)

    def sent(key: str) -> int:
        return sum(u[key] for u in usages)

    assert sent("steps") > 0 and sent("accepted") > 0, usages  # speculation really ran
    assert delta("splitspec:request_success_total") == len(usages)
    assert delta("splitspec:prompt_tokens_total") == sent("prompt")
    assert delta("splitspec:generation_tokens_total") == sent("completion")
    assert delta("splitspec:prefix_cache_queries_total") == sent("prompt")
    assert delta("splitspec:prefix_cache_hits_total") == sent("cached")
    assert delta("splitspec:spec_decode_num_drafts_total") == sent("steps")
    assert delta("splitspec:spec_decode_num_draft_tokens_total") == sent("drafts")
    assert delta("splitspec:spec_decode_num_accepted_tokens_total") == sent("accepted")
    assert delta("splitspec:spec_decode_num_accepted_tokens_per_pos_total") == sent("accepted")
    for hist in ("e2e_request_latency_seconds", "time_to_first_token_seconds",
                 "request_queue_time_seconds", "request_generation_tokens"):
        assert delta(f"splitspec:{hist}_count") == len(usages), hist
    assert delta("splitspec:request_generation_tokens_sum") == sent("completion")
    # Verify calls: one per verify step of a request running alone.
    verify = 'splitspec:target_step_device_seconds_count{"method": "Verify"}'
    assert after[verify] - before.get(verify, 0) == sent("steps")
    assert after["splitspec:num_requests_running"] == after["splitspec:num_requests_waiting"] == 0
    assert after["splitspec:draft_replicas_healthy"] == 1
    assert after["splitspec:target_serving"] == 1
    assert 0 < after["splitspec:kv_cache_usage_perc"] <= 1  # the radix cache holds prompts
    propose = [k for k in after if k.startswith("splitspec:draft_rpc_latency_seconds_count")]
    assert any('"Propose"' in k for k in propose), propose


def test_dashboard_queries_name_exported_metrics(eco_stack: EcoStack) -> None:
    status, raw = eco_stack.get("/metrics")
    # Family names: a labelled counter that never counted (no replica failed) has no samples.
    exported = {f.name for f in text_string_to_metric_families(raw.decode())}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 8
    for expr in exprs:
        names = re.findall(r"splitspec:[a-z0-9_:]+", expr)
        assert names, expr
        for name in names:
            name = re.sub(r"_(total|bucket|count|sum)$", "", name)
            assert name in exported, f"dashboard query {expr!r} names {name}, not exported"
