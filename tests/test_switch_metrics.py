"""The speculation switch on /metrics (router/metrics.py ``switch_families``): a real switch
after a few steps, rendered as Prometheus text and read back by prometheus-client's parser.
Scraped from a live router in tests/test_eco_metrics.py."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from router.metrics import switch_families
from router.spec_switch import SpeculationSwitch


class _Switch(Collector):
    def __init__(self, switch: SpeculationSwitch) -> None:
        self.switch = switch

    def collect(self):  # type: ignore[no-untyped-def]
        return switch_families(self.switch.status(), "m")


def scrape(switch: SpeculationSwitch) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(_Switch(switch))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_a_switch_that_measured_batch_one_exports_its_mode_rates_and_counts() -> None:
    switch = SpeculationSwitch(enabled=True)
    for _ in range(3):  # speculation first, as a new bucket starts: 2 tokens in 10 ms a step
        assert switch.speculate_next(1)
        switch.record(1, True, tokens=2, seconds=0.01)
    switch.hold_for_prefill()
    samples = scrape(switch)

    m = (("model_name", "m"),)
    assert samples["splitspec:spec_switch_enabled", m] == 1.0
    assert samples["splitspec:spec_switch_prefill_holds_total", m] == 1.0
    assert samples["splitspec:spec_switch_probes_total", m] == 0.0
    batch_one = (("batch_size", "1"), ("model_name", "m"))
    assert samples["splitspec:spec_switch_speculating", batch_one] == 1.0
    speculative = (("batch_size", "1"), ("mode", "speculative"), ("model_name", "m"))
    assert samples["splitspec:spec_switch_tokens_per_second", speculative] == 200.0


def test_a_switch_that_is_off_exports_zeros_and_no_buckets() -> None:
    samples = scrape(SpeculationSwitch(enabled=False))
    assert samples[("splitspec:spec_switch_enabled", (("model_name", "m"),))] == 0.0
    assert not [k for k in samples if k[0].startswith("splitspec:spec_switch_speculating")]
