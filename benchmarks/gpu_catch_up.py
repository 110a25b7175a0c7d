"""Acceptance after a drafter is caught up, in one process, without the router: the target engine
and the EAGLE drafter as the services build them, driven as the router drives them.

Per prompt: prefill, ingest, ``--rounds`` speculative rounds, a target-only spell of
``--spell`` multi-step decode Forwards, then the drafter is caught up three ways, each on its
own copy of the same greedy continuation: ``reingest`` (released and ingested whole from the
target's hidden pool, in the router's 256-row chunks, as after a probe), ``append`` (the spell's
tokens and pool rows appended as one update) and ``fresh`` (the whole context re-run through a
new target prefill, its rows ingested). Then ``--rounds`` more rounds each. It also compares the
hidden rows each Verify returned with what the pool holds for those positions afterwards (what
a catch-up reads).

  python -m benchmarks.gpu_catch_up --prompts PROMPTS.json --out OUT.json [--num-prompts 8]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.gpu_stack import chat_ids
from draft_service import arguments as draft_arguments
from draft_service import server as draft_server
from draft_service.drafter import ContextChunk
from target_service import arguments as target_arguments
from target_service import server as target_server
from target_service.admission import StepItem, VerifyItem
from target_service.request_table import SamplingSpec

GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
ROWS_PER_CHUNK = 256  # the target's ReadHidden chunk (target_service/servicer.py)
WIDTH = 2048  # target slots per request: request i owns [i * WIDTH, (i + 1) * WIDTH)


@dataclass
class Run:
    """One request driven by hand: its context, its slots and what its Verifies returned."""

    rid: str
    base: int
    context: list[int]
    computed: int = 0  # positions with KV and hidden rows (the root is at `computed`)
    sent: int = 0  # slots handed to the target so far
    verify_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    accepted: list[int] = field(default_factory=list)

    def slots(self, end: int) -> list[int]:
        new = list(range(self.base + self.sent, self.base + max(end, self.sent)))
        self.sent = max(end, self.sent)
        return new


def build(device: str, dtype: str):
    """The target engine and the EAGLE drafter as their services build them."""
    target_args = ["--device", device, "--dtype", dtype, "--attention", "paged",
                   "--num-slots", str(WIDTH * 24), "--decode-steps", "8"]  # fmt: skip
    parser = argparse.ArgumentParser()
    target_arguments.add_arguments(parser)
    engine = target_server.build_engine(
        target_arguments.config_from_args(parser.parse_args(target_args))
    )
    parser = argparse.ArgumentParser()
    draft_arguments.add_arguments(parser)
    draft_args = ["--method", "eagle", "--device", device, "--dtype", dtype]
    drafter = draft_server.load_drafter(
        draft_arguments.config_from_args(parser.parse_args(draft_args))
    )
    return engine, drafter


def prefill(engine, run: Run) -> None:
    n = len(run.context)
    out = engine.forward([StepItem(run.rid, run.context, 0, run.slots(n), True, GREEDY)])
    run.context.append(out.next_token_ids[0])
    run.computed = n


def ingest(engine, drafter, run: Run) -> None:
    """The router's catch-up: tokens 0..L and pool rows 0..L-1, chunk by chunk."""
    drafter.release(run.rid)
    rows = engine.read_hidden(run.rid, 0, run.computed)
    for s in range(0, run.computed, ROWS_PER_CHUNK):
        chunk = rows[s : s + ROWS_PER_CHUNK]
        first = 0 if s == 0 else s + 1
        drafter.append(ContextChunk(run.rid, first, run.context[first : s + len(chunk) + 1], s,
                                    chunk))  # fmt: skip


def speculative_round(engine, drafter, run: Run) -> None:
    tree = drafter.propose([run.rid])[0]
    tokens, start = [run.context[-1], *tree.token_ids[1:]], run.computed
    item = VerifyItem(run.rid, start, tokens, list(tree.parent_indices),
                      run.slots(start + len(tokens)), True)  # fmt: skip
    result = engine.verify([item]).results[0]
    for j in range(result.num_accepted + 1):
        run.verify_rows[start + j] = result.hidden[j].float()
    drafter.append(ContextChunk(run.rid, start + 1, result.token_ids, start, result.hidden))
    run.context += result.token_ids
    run.computed = start + result.num_accepted + 1
    run.accepted.append(result.num_accepted)


def spell(engine, run: Run, forwards: int, steps: int = 8) -> None:
    """Target-only multi-step Forwards, as a probe of target-only runs them."""
    for _ in range(forwards):
        start = run.computed
        item = StepItem(run.rid, [run.context[-1]], start, run.slots(start + steps), True, GREEDY)
        run.context += engine.forward([item], decode_steps=steps).next_token_ids
        run.computed = start + steps


WAYS = ("reingest", "append", "fresh")


def catch_up(engine, drafter, run: Run, way: str, held: int) -> Run:
    """The drafter brought level with the target after the spell, one of the three ways."""
    if way == "append":
        rows = engine.read_hidden(run.rid, held, run.computed)
        drafter.append(ContextChunk(run.rid, held + 1, run.context[held + 1 :], held, rows))
        return run
    if way == "fresh":
        again = Run(run.rid + "-fresh", run.base + WIDTH, run.context[: run.computed])
        prefill(engine, again)
        assert again.context[-1] == run.context[-1], "the prefill disagrees with the decode"
        drafter.release(run.rid)
        run = again
    ingest(engine, drafter, run)
    return run


def drive(engine, drafter, prompt: list[int], base: int, way: str, args) -> dict:
    """Rounds, a target-only spell, a catch-up, rounds: the accepted drafts of each round."""
    run = Run(f"{base}-{way}", base, list(prompt))
    prefill(engine, run)
    ingest(engine, drafter, run)
    for _ in range(args.rounds):
        speculative_round(engine, drafter, run)
    pool = engine.read_hidden(run.rid, 0, run.computed).float()
    row_diff = max((pool[p] - row).abs().max().item() for p, row in run.verify_rows.items())
    before, held = run.accepted, run.computed
    spell(engine, run, args.spell)
    run = catch_up(engine, drafter, run, way, held)
    run.accepted = []
    for _ in range(args.rounds):
        speculative_round(engine, drafter, run)
    drafter.release(run.rid)
    engine.release([f"{base}-{way}", f"{base}-{way}-fresh"])
    return {"before": before, "after": run.accepted, "row_diff": row_diff}


def mean(rounds: list[list[int]]) -> float:
    return sum(map(sum, rounds)) / max(1, sum(map(len, rounds)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--spell", type=int, default=6, help="multi-step Forwards of 8 tokens")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    engine, drafter = build(args.device, args.dtype)
    prompts = chat_ids(json.loads(args.prompts.read_text())["sharegpt_heldout"])
    runs = {way: [drive(engine, drafter, prompt, 3 * i * WIDTH, way, args)
                  for i, prompt in enumerate(prompts[: args.num_prompts])]
            for way in WAYS}  # fmt: skip
    summary = {"before": mean([r["before"] for r in runs["reingest"]])}
    summary |= {way: mean([r["after"] for r in runs[way]]) for way in WAYS}
    summary["row_diff_max"] = max(r["row_diff"] for rs in runs.values() for r in rs)
    args.out.write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
