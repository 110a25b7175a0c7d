"""`splitspec status`: a router's GetServerStatus, as lines a person reads at a glance."""

from __future__ import annotations

from protos import generation_pb2 as pb


def status_lines(address: str, s: pb.ServerStatus) -> list[str]:
    state = "serving" if not s.unavailable_reason else f"NOT serving: {s.unavailable_reason}"
    lines = [
        f"router {address} (up {_duration(s.uptime_s)}): {state}",
        f"requests: {s.num_running} running, {s.num_waiting} waiting; "
        f"{s.num_finished_requests:,} finished, {s.num_generated_tokens:,} tokens generated"
        + (f", {s.num_retractions:,} retracted under KV pressure" if s.num_retractions else ""),
        f"KV slots: {s.num_free_slots:,} free of {s.num_total_slots:,}; "
        f"{s.num_cached_tokens:,} tokens in the prefix cache",
        _speculation(s.speculation),
        *_switch(s.speculation_switch),
        *_replicas(s.draft_replicas),
    ]
    for timing, label in ((s.target_only_steps, "target-only"), (s.speculative_steps,
                                                                  "speculative")):  # fmt: skip
        if timing.steps:
            lines.append(_step_timing(label, timing))
    return lines


def _step_timing(label: str, t: pb.StepTiming) -> str:
    """Where a step's time goes: the target's call, the wait for the drafter (what was left of
    a Propose sent during the step before), the router's own share (scheduling, commit,
    streaming) and, where the services report it, their device time."""
    line = (f"{label} decode steps: {t.steps:,}, {t.step_ms:.2f} ms each: target call "
            f"{t.target_call_ms:.2f} ms (its work {t.target_compute_ms:.2f})")  # fmt: skip
    if t.draft_call_ms or t.draft_compute_ms:
        line += (f", wait for the drafter {t.draft_call_ms:.2f} ms (its work "
                 f"{t.draft_compute_ms:.2f})")  # fmt: skip
    router_ms = max(t.step_ms - t.target_call_ms - t.draft_call_ms, 0.0)
    line += f", router {router_ms:.2f} ms ({router_ms / t.step_ms:.0%})"
    device_ms = t.target_device_ms + t.draft_device_ms
    if device_ms:
        line += f"; device time {device_ms:.2f} ms ({device_ms / t.step_ms:.0%})"
    return line


def _speculation(stats: pb.SpeculationStats) -> str:
    if not stats.verify_steps:
        return "speculation: no verify steps yet"
    return (f"speculation: {stats.mean_acceptance_length:.2f} tokens per verify step over "
            f"{stats.verify_steps:,} steps ({stats.accepted_tokens:,} of {stats.draft_tokens:,} "
            "drafts accepted)")  # fmt: skip


def _switch(switch: pb.SpeculationSwitchStatus) -> list[str]:
    """The router's --adaptive-speculation: its counts, then each batch-size bucket that ran
    steps, with the mode it holds and the two rates it compares."""
    if not switch.enabled:
        return ["speculation switch: off (speculation wherever a request allows it)"]
    lines = [f"speculation switch: on ({_count(switch.num_switches, 'mode change')}, "
             f"{_count(switch.num_probes, 'probe')}, {_count(switch.num_prefill_holds, 'step')} "
             "held target-only as they ended a prompt's prefill)"]  # fmt: skip
    for b in switch.buckets:
        if b.speculative_steps or b.target_only_steps:
            mode = "speculating" if b.speculating else "target-only"
            lines.append(
                f"  batch {b.batch_size}: {mode}{' (probing)' if b.probing else ''}; "
                f"speculative {b.speculative_tok_s:,.0f} tok/s over {b.speculative_steps:,} "
                f"steps, target-only {b.target_only_tok_s:,.0f} over {b.target_only_steps:,}"
            )
    return lines


def _replicas(replicas: list[pb.DraftReplicaStatus]) -> list[str]:
    if not replicas:
        return ["draft replicas: none (target-only)"]
    healthy = sum(r.healthy for r in replicas)
    lines = [f"draft replicas: {healthy} of {len(replicas)} healthy"]
    for r in replicas:
        state = "healthy" if r.healthy else f"out of rotation: {r.error or 'unhealthy'}"
        method = f"{r.method}, " if r.method else ""
        lines.append(f"  {r.address} ({method}{r.num_requests} requests): {state}")
    return lines


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
