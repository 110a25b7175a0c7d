"""What logprobs cost through the whole stack, and that they change nothing they should not.

  python -m benchmarks.bench_logprobs [--device cuda --dtype bfloat16] [--prompts 12]

One stack (router, target, one EAGLE replica on the same device) serves batch-1 greedy
requests on the hand-written short instructions (benchmarks/data), EOS ignored so that every
reply runs its whole length. Six arms: speculation off and on, each with logprobs off, on
(the chosen token's only) and on with the 20 likeliest tokens. The arms run interleaved
prompt by prompt, their order turned a place each prompt, so a box's drift hits them alike,
and every prompt is in the radix cache first (else the first arm to meet a prompt would pay
its prefill for the others); each arm's tok/s is its tokens over its streams' wall time, and
its ratio is against the same speculation mode without logprobs.

Checks, recorded in the JSON: the token ids do not change with logprobs; speculation reports
the target-only values (the largest difference of a chosen token's log-probability).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_stack import INSTRUCTIONS, chat_ids
from benchmarks.interleaved import bench_args, run_on_stack
from benchmarks.run_record import machine_info, utc_now, versions
from splitspec.client import Client, GenerationResult, build_request

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {"off": None, "chosen": 0, "top20": 20}  # name -> top_logprobs (None: no logprobs)


def one_request(
    client: Client, ids: list[int], max_new: int, speculate: bool, top: int | None
) -> GenerationResult:
    request = build_request("", False, max_new, 0.0, speculate=speculate, top_logprobs=top)
    request.input_ids.ids.extend(ids)
    request.sampling.ignore_eos = True
    return client.generate(request)


ARMS = {f"{'spec' if s else 'base'}_{m}": (s, t) for s in (False, True)
        for m, t in MODES.items()}  # fmt: skip


def summarize(results: dict[str, list[GenerationResult]]) -> dict:
    rows = {}
    for name, runs in results.items():
        tokens = sum(len(r.token_ids) for r in runs)
        seconds = sum(r.seconds for r in runs)
        rows[name] = {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}
    for name, row in rows.items():
        row["ratio_to_no_logprobs"] = row["tok_s"] / rows[name.rsplit("_", 1)[0] + "_off"]["tok_s"]
    return rows


def checks(results: dict[str, list[GenerationResult]]) -> dict:
    same_ids = all(
        [r.token_ids for r in results[f"{kind}_{mode}"]]
        == [r.token_ids for r in results[f"{kind}_off"]]
        for kind in ("base", "spec")
        for mode in MODES
    )
    spec, base = results["spec_top20"], results["base_top20"]
    diffs = [
        abs(a.chosen.logprob - b.chosen.logprob)
        for s, b_run in zip(spec, base, strict=True)
        if s.token_ids == b_run.token_ids
        for a, b in zip(s.logprobs, b_run.logprobs, strict=True)
    ]
    equal_outputs = sum(s.token_ids == b.token_ids for s, b in zip(spec, base, strict=True))
    return {
        "token_ids_unchanged_by_logprobs": same_ids,
        "spec_equals_target_only": f"{equal_outputs}/{len(spec)}",
        "max_chosen_logprob_diff_spec_vs_target_only": max(diffs, default=None),
        "entries_per_token": all(len(r.logprobs) == len(r.token_ids) for r in spec + base),
    }


def main() -> None:
    args = bench_args(__doc__.splitlines()[0])
    texts = json.loads(INSTRUCTIONS.read_text())["prompts"][: args.prompts]
    prompts = chat_ids(texts)
    results, _ = run_on_stack(args, prompts, ARMS, one_request)
    spec = results["spec_off"]
    acceptance = [r.final.speculation.mean_acceptance_length for r in spec if r.final]
    record = {
        "benchmark": "logprobs", "when": utc_now(), "device": args.device, "dtype": args.dtype,
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "arms": summarize(results), "checks": checks(results),
        "mean_acceptance_length": sum(acceptance) / max(1, len(acceptance)),
        "machine": machine_info(0), "versions": versions(),
    }  # fmt: skip
    print(
        json.dumps({k: record[k] for k in ("arms", "checks", "mean_acceptance_length")}, indent=1)
    )
    out = (
        args.out or RESULTS / f"logprobs_{args.device}_{record['when'][:16].replace(':', '')}.json"
    )
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
