"""benchmarks/acceptance_by_round.py: a router debug log's rounds, binned by their index."""

from __future__ import annotations

from pathlib import Path

from benchmarks.acceptance_by_round import by_index, rounds_by_request

LINE = ("2026-12-05 19:20:01,000 splitspec.router round {round} of {rid} at position {pos}: "
        "{accepted} of 15 drafts accepted: [1, 2]")  # router/speculation.py's after_verify


def test_each_requests_rounds_count_from_its_first(tmp_path: Path) -> None:
    log = tmp_path / "router.log"
    # Two requests interleaved; a line of another kind between them.
    a = [4, 0, 2, 2, 1, 3]
    b = [1, 1]
    lines = [LINE.format(round=i + 1, rid="a", pos=10 + i, accepted=n) for i, n in enumerate(a)]
    lines.insert(1, LINE.format(round=1, rid="b", pos=5, accepted=b[0]))
    lines.insert(3, "2026-12-05 19:20:01,001 splitspec.router step: batch 2, speculative")
    lines.append(LINE.format(round=2, rid="b", pos=7, accepted=b[1]))
    log.write_text("\n".join(lines) + "\n")

    rounds = rounds_by_request(log)
    assert rounds == {"a": a, "b": b}
    first, second = by_index(rounds)
    assert first == {"rounds": "1-4", "num_rounds": 6, "tokens_per_round": 1 + 10 / 6}
    assert second == {"rounds": "5-8", "num_rounds": 2, "tokens_per_round": 1 + 4 / 2}
