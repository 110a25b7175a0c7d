"""Acceptance by a round's index in its reply, from a router's debug log: does speculation
accept as well in a reply's opening rounds, which the switch judges first, as later on?

    splitspec serve --no-adaptive-speculation --log-level debug   # prints its log folder
    splitspec bench --speculation on --prompts sharegpt --num-prompts 12 --max-new-tokens 256
    python -m benchmarks.acceptance_by_round /tmp/splitspec-logs-XXXX/router.log --out F.json

Reads the router's per-round lines (router/speculation.py, ``after_verify``); each request's
rounds in the order they ran. Greedy replies commit the target's tokens whatever the drafter
does, so the figures are the drafter's alone.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.run_record import git_commit, utc_now, write_json

ROUND = re.compile(r"round \d+ of (\S+) at position \d+: (\d+) of \d+ drafts accepted")
BINS = ((1, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 10**9))


def rounds_by_request(log: Path) -> dict[str, list[int]]:
    """Each request's accepted drafts per round, in order."""
    rounds: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        if match := ROUND.search(line):
            rounds[match.group(1)].append(int(match.group(2)))
    return rounds


def by_index(rounds: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Per bin of round indices (1-based): rounds, and tokens a round (accepted + the bonus)."""
    rows = []
    for first, last in BINS:
        accepted = [a for r in rounds.values() for a in r[first - 1 : last]]
        if accepted:
            rows.append({"rounds": f"{first}-{last}" if last < 10**9 else f"{first}+",
                         "num_rounds": len(accepted),
                         "tokens_per_round": 1 + sum(accepted) / len(accepted)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="a router log at --log-level debug")
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    parser.add_argument("--note", default="", help="how the log was made, kept in the JSON")
    args = parser.parse_args(argv)
    rounds = rounds_by_request(args.log)
    rows = by_index(rounds)
    for row in rows:
        print(f"rounds {row['rounds']:>7}: {row['num_rounds']:5d} rounds, "
              f"{row['tokens_per_round']:.2f} tokens a round")  # fmt: skip
    if args.out:
        write_json(args.out, {"when": utc_now(), "commit": git_commit(), "note": args.note,
                              "num_requests": len(rounds), "by_round": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
