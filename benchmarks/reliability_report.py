"""What benchmarks/reliability.py reports once its phases have run: one table of what the
stack held, survived and leaked, and the JSON with the machine, the commit and every figure."""

from __future__ import annotations

from pathlib import Path

from benchmarks.run_record import git_commit, machine_info, utc_now, write_json


def table(f: dict) -> str:
    d, b, h, a, t, k = (f[x] for x in ("draft_faults", "burst", "hostile", "abort_storm",
                                       "target_loss", "leaks"))  # fmt: skip
    lost = d["failed"] + d["changed_outputs"] + b["admitted_wrong"] + (
        0 if t["outputs_after_equal"] else 1)  # fmt: skip
    survived = (d["failed"] == 0 and d["changed_outputs"] == 0) * 2 + (
        t["ended_unavailable"] == t["in_flight"] and t["outputs_after_equal"]
    )
    rows = [
        ("load held", f"{d['concurrency']} concurrent greedy streams, {d['streams']} requests, "
                      f"{d['tokens']} tokens, through the draft faults"),
        ("faults injected", "replica SIGKILL + restart; replica SIGSTOP 5 s; target SIGKILL + "
                            "restart"),
        ("faults survived", f"{survived}/3 (worst step while a replica was stopped "
                            f"{d['worst_step_while_stopped_ms']:.0f} ms, median before "
                            f"{d['median_step_before_ms']:.0f} ms; target loss: "
                            f"{t['ended_unavailable']}/{t['in_flight']} UNAVAILABLE in "
                            f"{t['ended_within_s']:.1f} s, serving again in "
                            f"{t['serving_again_after_s']:.1f} s)"),
        ("bad inputs tried", f"{h['tried']} hostile ({h['wrong_answers']} wrong answers), "
                             f"burst {b['sent']} ({b['refused']} refused in "
                             f"{b.get('median_refusal_ms', 0):.0f} ms median, slowest "
                             f"{b['slowest_refusal_ms']:.0f} ms), {a['requests']} aborts/cancels "
                             f"({a['unexpected']} unexpected endings)"),
        ("requests lost", str(lost)),
        ("slots leaked", f"{k['router_slots_leaked']} router slots; requests still held: "
                         + ", ".join(f"{n} {v}" for n, v in k["requests_still_held"].items())),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"| {n.ljust(width)} | {v} |" for n, v in rows)


def write_report(out: Path, quick: bool, figures: dict) -> None:
    write_json(
        out,
        {
            "date": utc_now(),
            "commit": git_commit(),
            "quick": quick,
            "machine": machine_info(1),
            "figures": figures,
            "table": table(figures),
        },
    )
