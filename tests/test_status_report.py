"""`splitspec status`'s lines for the speculation switch and the step timings
(splitspec/status_report.py)."""

from __future__ import annotations

from protos import generation_pb2 as pb
from splitspec.status_report import status_lines


def switch_lines(switch: pb.SpeculationSwitchStatus) -> list[str]:
    lines = status_lines("127.0.0.1:50051", pb.ServerStatus(speculation_switch=switch))
    return [line for line in lines if "switch" in line or line.startswith("  batch")]


def test_a_switch_that_is_off_says_speculation_runs_wherever_allowed() -> None:
    assert switch_lines(pb.SpeculationSwitchStatus(enabled=False)) == [
        "speculation switch: off (speculation wherever a request allows it)"
    ]


def test_each_bucket_that_ran_steps_shows_its_mode_and_rates() -> None:
    measured = pb.SpeculationSwitchBucket(
        batch_size=1, speculative_tok_s=276.7, target_only_tok_s=920.5, speculating=False,
        speculative_steps=20, target_only_steps=115, num_probes=2, num_switches=1,
    )  # fmt: skip
    probing = pb.SpeculationSwitchBucket(
        batch_size=4, speculative_tok_s=3100, target_only_tok_s=2900, speculating=True,
        speculative_steps=40, target_only_steps=3, probing=True,
    )  # fmt: skip
    unused = pb.SpeculationSwitchBucket(batch_size=2, speculating=False)
    switch = pb.SpeculationSwitchStatus(
        enabled=True, num_switches=1, num_probes=2, num_prefill_holds=3,
        buckets=[measured, unused, probing],
    )  # fmt: skip
    assert switch_lines(switch) == [
        "speculation switch: on (1 mode change, 2 probes, 3 steps held target-only as they "
        "ended a prompt's prefill)",
        "  batch 1: target-only; speculative 277 tok/s over 20 steps, target-only 920 over 115",
        "  batch 4: speculating (probing); speculative 3,100 tok/s over 40 steps, target-only "
        "2,900 over 3",
    ]


def step_lines(**timings: pb.StepTiming) -> list[str]:
    lines = status_lines("127.0.0.1:50051", pb.ServerStatus(**timings))
    return [line for line in lines if "decode steps" in line]


def test_a_speculative_step_splits_into_target_drafter_router_and_device_time() -> None:
    """The H200's batch-1 round of 2026-12-03 (README, "On a GPU"): 2.95 ms, of which the
    router's own 0.19 and device time 1.71."""
    timing = pb.StepTiming(
        steps=1200, step_ms=2.95, target_call_ms=1.60, target_compute_ms=1.32,
        draft_call_ms=1.16, draft_compute_ms=1.00, target_device_ms=1.06, draft_device_ms=0.65,
    )  # fmt: skip
    assert step_lines(speculative_steps=timing) == [
        "speculative decode steps: 1,200, 2.95 ms each: target call 1.60 ms (its work 1.32), "
        "wait for the drafter 1.16 ms (its work 1.00), router 0.19 ms (6%); device time 1.71 ms "
        "(58%)"
    ]


def test_a_target_only_step_on_the_cpu_has_no_drafter_or_device_part() -> None:
    timing = pb.StepTiming(steps=16, step_ms=86.5, target_call_ms=77.6, target_compute_ms=75.0)
    assert step_lines(target_only_steps=timing) == [
        "target-only decode steps: 16, 86.50 ms each: target call 77.60 ms (its work 75.00), "
        "router 8.90 ms (10%)"
    ]
