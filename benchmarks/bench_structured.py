"""What structured output costs through the whole stack, and what it buys.

  python -m benchmarks.bench_structured [--device cuda --dtype bfloat16] [--prompts 12]

One stack (router, target, one EAGLE replica on the same device) serves batch-1 greedy
requests: the hand-written short instructions (benchmarks/data), each with " Answer in JSON."
appended, replies ending at EOS or max_new_tokens. Four arms: speculation off and on, each
free and with ``json_object`` (any JSON object). Arms run interleaved prompt by prompt, their
order turned a place each prompt, every prompt in the radix cache first (as in
bench_logprobs.py); an arm's tok/s is its tokens over its streams' wall time. The constrained
arms run one decode step a Forward (on CUDA the LOGITS decode graphs and, greedy up to batch
4, the masked verify graphs) and the router computes a mask per sampled or verified
position, so their tok/s are compared with the free arms'.

Recorded: tok/s and mean acceptance per arm; how many replies parse as a JSON object (free
and constrained); whether speculation gives exactly target-only's tokens under the
constraint (greedy).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_stack import INSTRUCTIONS, chat_ids
from benchmarks.interleaved import bench_args, run_on_stack
from benchmarks.run_record import git_commit, machine_info, utc_now, versions
from protos import generation_pb2 as pb
from splitspec.client import Client, GenerationResult, build_request

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = {f"{'spec' if s else 'base'}_{'json' if j else 'free'}": (s, j)
        for s in (False, True) for j in (False, True)}  # fmt: skip


def one_request(
    client: Client, ids: list[int], max_new: int, speculate: bool, constrained: bool
) -> GenerationResult:
    """A batch-1 greedy request for ``ids``, free or held to any JSON object."""
    fmt = pb.StructuredOutput(json_object=True) if constrained else None
    request = build_request("", False, max_new, 0.0, speculate=speculate, structured_output=fmt)
    request.input_ids.ids.extend(ids)
    return client.generate(request)


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def summarize(results: dict[str, list[GenerationResult]]) -> dict:
    rows = {name: arm_row(runs) for name, runs in results.items()}
    for name, row in rows.items():
        row["ratio_to_free"] = row["tok_s"] / rows[name.rsplit("_", 1)[0] + "_free"]["tok_s"]
    return rows


def arm_row(runs: list[GenerationResult]) -> dict:
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    finals = [r.final for r in runs if r.final is not None]
    accepted = [f.speculation.mean_acceptance_length for f in finals]
    return {
        "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
        "mean_acceptance_length": sum(accepted) / max(1, len(accepted)),
        "json_objects": f"{sum(is_json_object(r.text) for r in runs)}/{len(runs)}",
        "ended_at_eos": sum(f.finish_reason == pb.FINISH_REASON_EOS for f in finals),
    }  # fmt: skip


def main() -> None:
    args = bench_args(__doc__.splitlines()[0])
    texts = json.loads(INSTRUCTIONS.read_text())["prompts"][: args.prompts]
    prompts = chat_ids([f"{text} Answer in JSON." for text in texts])
    results = run_on_stack(args, prompts, ARMS, one_request)
    spec, base = results["spec_json"], results["base_json"]
    equal = sum(s.token_ids == b.token_ids for s, b in zip(spec, base, strict=True))
    record = {
        "benchmark": "structured_output", "when": utc_now(), "commit": git_commit(),
        "device": args.device,
        "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "arms": summarize(results), "spec_equals_target_only_json": f"{equal}/{len(spec)}",
        "machine": machine_info(0), "versions": versions(),
    }  # fmt: skip
    print(json.dumps({k: record[k] for k in ("arms", "spec_equals_target_only_json")}, indent=1))
    stamp = record["when"][:16].replace(":", "").replace("T", "_")
    out = args.out or RESULTS / f"structured_{args.device}_{stamp}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
