"""The router's cost of structured output's masks, in-process on the default model's tokenizer.

  python -m benchmarks.structured_masks [--out benchmarks/results/structured_masks.json]

A JSON reply is walked token by token under ``json_object``; at each position the router's
work for a round is timed: one mask (a decode step's), and the masks of a 64-node tree (the
GPU's default tree size): the reply's next 8 tokens as a chain under the root and 55 more
nodes under random parents, half of them tokens the grammar allows there and half any token
(which the walk drops). Prints and saves the medians and maxima.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.run_record import git_commit, machine_info, utc_now
from model_runtime.loading import default_model_path
from protos import generation_pb2 as pb
from router.grammar_tree import allows
from router.structured_output import compile_format
from router.tokenizer import Tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
REPLY = ('{\n  "name": "Ada",\n  "age": 36,\n  "likes": ["red", "green"],\n'
         '  "city": {"name": "London", "country": "UK"}\n}')  # fmt: skip
NODES, CHAIN = 64, 8


def random_tree(rnd: random.Random, root: int, chain: list[int], allowed: list[int], vocab: int):
    tokens, parents = [root], [-1]
    for token in chain:
        tokens.append(token)
        parents.append(len(tokens) - 2)
    while len(tokens) < NODES:
        parents.append(rnd.randrange(len(tokens)))
        tokens.append(rnd.choice(allowed) if rnd.random() < 0.5 else rnd.randrange(vocab))
    return tokens, parents


def time_ms(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def walk(tokenizer: Tokenizer) -> dict[str, list[float]]:
    constraint = compile_format(pb.StructuredOutput(json_object=True), tokenizer)
    assert constraint is not None
    rnd = random.Random(0)
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    times: dict[str, list[float]] = {"mask_ms": [], "tree_ms": []}
    for k in range(len(ids) - CHAIN):
        mask = constraint.mask()
        allowed = [t for t in range(tokenizer.vocab_size) if allows(mask, t)]
        root = ids[k - 1] if k else 0
        tree = random_tree(rnd, root, ids[k : k + CHAIN], allowed, tokenizer.vocab_size)
        times["tree_ms"].append(time_ms(lambda: constraint.live_tree(*tree)))  # noqa: B023
        times["mask_ms"].append(time_ms(constraint.mask))
        constraint.advance([ids[k]])
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS / "structured_masks.json")
    args = p.parse_args()
    times = walk(Tokenizer.from_model_path(str(default_model_path())))
    summary = {f"{name}_{stat}": fn(values) for name, values in times.items()
               for stat, fn in (("median", statistics.median), ("max", max))}  # fmt: skip
    record = {"benchmark": "structured_masks", "when": utc_now(), "commit": git_commit(),
              "positions": len(times["mask_ms"]), "tree_nodes": NODES, **summary,
              "machine": machine_info(0)}  # fmt: skip
    print(json.dumps(summary, indent=1))
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
