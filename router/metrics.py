"""Prometheus metrics of the router, named as vLLM names them, with a ``splitspec:`` prefix.

Existing vLLM dashboards and autoscaling queries port over by changing ``vllm:`` to
``splitspec:``. Counters and histograms are fed by the scheduler's hooks (router.telemetry);
gauges (running, waiting, KV usage, healthy replicas) are read from the scheduler at scrape
time. Latencies are measured in the router, on one clock, from the request's arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from protos import generation_pb2 as pb
from router import telemetry

P = "splitspec:"
disable_created_metrics()  # no *_created samples: as vLLM does, they only clutter scrapes
MAX_POSITIONS = 16  # acceptance by position: deeper positions are counted in the last one
_POSITIONS = [str(pos) for pos in range(MAX_POSITIONS)]
FINISHED: dict[int, str] = {
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_EOS: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_ABORT: "abort",
}
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 60, 120, 240, 480, 960)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# 0.3-9 ms a format on the dev box; the vocabulary's first view adds 0.18 s.
COMPILE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class RouterMetrics(telemetry.Observer):
    """The Prometheus observer. ``registry`` is what /metrics exposes."""

    def __init__(self, model_name: str, scheduler: Any = None) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._last_emit: dict[str, float] = {}
        # Labelled children by (metric, label values): ``labels()`` takes a lock and checks its
        # arguments on every call, and a round makes a dozen of these calls.
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        self._define()
        if scheduler is not None:
            self.registry.register(SchedulerGauges(scheduler, model_name))

    def _define(self) -> None:
        r, m = self.registry, ["model_name"]

        def hist(name: str, doc: str, buckets: tuple, extra: tuple = ()) -> Histogram:
            return Histogram(P + name, doc, [*m, *extra], buckets=buckets, registry=r)

        def count(name: str, doc: str, extra: tuple = ()) -> Counter:
            return Counter(P + name, doc, [*m, *extra], registry=r)

        self.ttft = hist("time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Time per output token.", ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to last token.", E2E_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Arrival to first step.", E2E_BUCKETS)
        self.prompt_hist = hist("request_prompt_tokens", "Prompt tokens.", TOKEN_BUCKETS)
        self.gen_hist = hist("request_generation_tokens", "Completion tokens.", TOKEN_BUCKETS)
        self.success = count("request_success", "Finished requests.", ("finished_reason",))
        self.failure = count("request_failure", "Requests ended by a server error.")
        self.prompt_tokens = count("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = count("generation_tokens", "Tokens generated and streamed.")
        self.cache_queries = count("prefix_cache_queries", "Prompt tokens looked up.")
        self.cache_hits = count("prefix_cache_hits", "Prompt tokens served from the radix cache.")
        self.drafts = count("spec_decode_num_drafts", "Verified draft trees (verify steps).")
        self.draft_tokens = count("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.accepted = count("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.accepted_pos = count(
            "spec_decode_num_accepted_tokens_per_pos", "Accepted drafts by depth.", ("position",)
        )
        self.target_step = hist(
            "target_step_device_seconds", "Target's own time per call.", STEP_BUCKETS, ("method",)
        )
        self.draft_rpc = hist(
            "draft_rpc_latency_seconds", "Draft replica calls.", STEP_BUCKETS, ("replica", "method")
        )
        self.draft_down = count("draft_unavailable", "Replica failures.", ("replica",))
        self.forced = count("spec_decode_num_forced_tokens", "Draft tokens formats forced.")
        self._define_structured(hist, count)

    def _define_structured(
        self, hist: Callable[..., Histogram], count: Callable[..., Counter]
    ) -> None:
        """Structured output and tool calling. Labels stay bounded: a format's kind (five
        StructuredOutput fields) and tool_choice's four values, never a schema or a name."""
        fmt = ("format",)
        self.format_requests = count("structured_output_requests", "Admitted, by format.", fmt)
        self.format_refusals = count("structured_output_refused", "Refused formats.", fmt)
        self.compile_time = hist(
            "structured_output_compile_seconds", "Format compilations.", COMPILE_BUCKETS, fmt
        )
        # Queries and hits, as the prefix cache counts: hit rate is hits / queries.
        self.format_queries = count("structured_output_cache_queries", "Formats looked up.")
        self.format_hits = count("structured_output_cache_hits", "Formats found compiled.")
        self.tool_requests = count("tool_call_requests", "Requests with tools.", ("tool_choice",))
        self.tool_calls = count("tool_calls", "Tool calls in replies.")

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(model_name, *values)``, made once."""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model_name, *values)
        return child

    # ---- the hooks --------------------------------------------------------------------------

    def tokens_committed(self, req: Any, num_tokens: int, now: float) -> None:
        last = self._last_emit.get(req.request_id)
        self._last_emit[req.request_id] = now
        self._child(self.generation_tokens).inc(num_tokens)
        if last is not None and num_tokens:
            per_token = (now - last) / num_tokens  # a verified block arrives all at once
            itl = self._child(self.itl)
            for _ in range(num_tokens):
                itl.observe(per_token)

    def request_finished(self, req: Any, reason: int, now: float) -> None:
        self._last_emit.pop(req.request_id, None)
        name = self.model_name
        self.success.labels(name, FINISHED.get(reason, "abort")).inc()
        self.prompt_tokens.labels(name).inc(req.prompt_len)
        self.prompt_hist.labels(name).observe(req.prompt_len)
        self.gen_hist.labels(name).observe(len(req.output_ids))
        self.cache_queries.labels(name).inc(req.prompt_len)
        self.cache_hits.labels(name).inc(req.prompt_cached_len)
        self.e2e.labels(name).observe(now - req.arrival)
        if req.first_scheduled is not None:
            self.queue.labels(name).observe(req.first_scheduled - req.arrival)
        if req.first_token is not None:
            self.ttft.labels(name).observe(req.first_token - req.arrival)

    def request_failed(self, req: Any, message: str, now: float) -> None:
        self._last_emit.pop(req.request_id, None)
        self._child(self.failure).inc()

    def tree_verified(self, num_draft_tokens: int, num_accepted: int) -> None:
        self._child(self.drafts).inc()
        self._child(self.draft_tokens).inc(num_draft_tokens)
        self._child(self.accepted).inc(num_accepted)
        for pos in range(num_accepted):
            self._child(self.accepted_pos, _POSITIONS[min(pos, MAX_POSITIONS - 1)]).inc()

    def target_call(self, method: str, device_ms: float) -> None:
        self._child(self.target_step, method).observe(device_ms / 1e3)

    def draft_call(self, address: str, method: str, seconds: float) -> None:
        self._child(self.draft_rpc, address, method).observe(seconds)

    def draft_failure(self, address: str, reason: str) -> None:
        self.draft_down.labels(self.model_name, address).inc()

    def request_admitted(self, req: Any) -> None:
        if req.constraint is not None:
            self._child(self.format_requests, req.constraint.kind).inc()

    def format_looked_up(self, hit: bool) -> None:
        self._child(self.format_queries).inc()
        if hit:
            self._child(self.format_hits).inc()

    def format_compiled(self, kind: str, seconds: float) -> None:
        # A worker thread: labels() takes the metric's lock, where _child's dict would race.
        self.compile_time.labels(self.model_name, kind).observe(seconds)

    def format_refused(self, kind: str) -> None:
        self._child(self.format_refusals, kind).inc()

    def tokens_forced(self, num_tokens: int) -> None:
        self._child(self.forced).inc(num_tokens)

    def tools_offered(self, tool_choice: str) -> None:
        self._child(self.tool_requests, tool_choice).inc()

    def tool_calls_made(self, num_calls: int) -> None:
        self._child(self.tool_calls).inc(num_calls)


class SchedulerGauges(Collector):
    """Gauges read from the scheduler when Prometheus scrapes (no bookkeeping in between)."""

    def __init__(self, scheduler: Any, model_name: str) -> None:
        self.scheduler = scheduler
        self.model_name = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s, kv = self.scheduler, self.scheduler.kv
        used = 1.0 - kv.num_free / kv.num_total if kv.num_total else 0.0
        serving = 0 if s.target_unavailable else 1
        values = [
            ("num_requests_running", "Requests in the running batch.", len(s.running)),
            ("num_requests_waiting", "Requests in the admission queue.", len(s.waiting)),
            ("kv_cache_usage_perc", "Fraction of KV slots in use or cached.", used),
            ("radix_cache_tokens", "Tokens held by the radix cache.", kv.cache.num_cached_tokens),
            ("draft_replicas_healthy", "Draft replicas in rotation.", len(s.spec.pool.healthy)),
            ("target_serving", "1 while the target serves, 0 while lost or unfit.", serving),
        ]
        for name, doc, value in values:
            family = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(value))
            yield family
        # vLLM's name for it; read at scrape time, like the gauges (router/retraction.py).
        preempted = CounterMetricFamily(
            P + "num_preemptions", "Running requests retracted under KV pressure.",
            labels=["model_name"],
        )  # fmt: skip
        preempted.add_metric([self.model_name], float(s.counters.num_retractions))
        yield preempted
        yield from switch_families(s.mode.switch.status(), self.model_name)


def switch_families(
    switch: pb.SpeculationSwitchStatus, model_name: str
) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The speculation switch (--adaptive-speculation), as GetServerStatus gives it: whether it
    is on, its counts, and per batch-size bucket that ran steps its mode and its two rates."""
    enabled = GaugeMetricFamily(P + "spec_switch_enabled", "1 with --adaptive-speculation.",
                                labels=["model_name"])  # fmt: skip
    enabled.add_metric([model_name], float(switch.enabled))
    yield enabled
    counts = [("spec_switch_mode_changes", "Mode changes of the switch's buckets.",
               switch.num_switches),
              ("spec_switch_probes", "Probes of the mode not in use.", switch.num_probes),
              ("spec_switch_prefill_holds", "Steps held target-only as they ended a prefill.",
               switch.num_prefill_holds)]  # fmt: skip
    for name, doc, value in counts:
        family = CounterMetricFamily(P + name, doc, labels=["model_name"])
        family.add_metric([model_name], float(value))
        yield family
    buckets = [b for b in switch.buckets if b.speculative_steps or b.target_only_steps]
    mode = GaugeMetricFamily(P + "spec_switch_speculating", "1 where the bucket speculates.",
                             labels=["model_name", "batch_size"])  # fmt: skip
    rate = GaugeMetricFamily(P + "spec_switch_tokens_per_second", "A bucket's measured rate "
                             "of each mode.", labels=["model_name", "batch_size", "mode"])
    for b in buckets:
        size = str(b.batch_size)
        mode.add_metric([model_name, size], float(b.speculating))
        rate.add_metric([model_name, size, "speculative"], b.speculative_tok_s)
        rate.add_metric([model_name, size, "target_only"], b.target_only_tok_s)
    yield mode
    yield rate
