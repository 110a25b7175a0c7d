"""GPU benchmark: the whole stack against HF transformers on the same prompts, in one run.

  python -m benchmarks.bench_gpu --prompts PROMPTS.json [--out benchmarks/results/gpu.json]

PROMPTS.json holds {"sharegpt_heldout": [...], "humaneval": [...]} (write it on a machine with
the data wheels: `python -m benchmarks.bench_gpu --write-prompts PROMPTS.json`). Phases:
target-only tok/s through router + target processes (public gRPC) at batch 1, 8 and 32, with
and without the target's CUDA graphs; HF eager and HF with a static cache and one CUDA graph per
decode step, batch 1; speculation (EAGLE) against target-only with outputs compared, in fp32
and bf16, the target's top-two logit gap at each first difference; EAGLE by tree shape, and
per prompt set (held-out ShareGPT, HumanEval, the short instructions of
benchmarks/data/short_instructions.json: acceptance and speed); bf16 speculation on against
off in batches of each --batches size (1, 8, 32) whose composition differs between the runs
(`--exact` runs that target with batch-invariant numerics); in-process step times of the
default model and of a Llama-3.1-8B shape against the HBM floor; single requests with
pauses between them, EAGLE and target-only (``bursty``: where idle-aware spinners sleep).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import gpu_spec_phases, gpu_stack, gpu_target_only
from benchmarks.gpu_peers import hf_eager_tok_s, hf_graph_tok_s, top2_gap
from benchmarks.gpu_stack import (
    chat_ids,
    prefill_once,
    prompt_set_ids,
    stack,
    step_timing,
    throughput,
)
from benchmarks.run_record import git_commit, utc_now
from plumbing import cpu_wake
from splitspec.client import Client

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu.json"
def speculation_phase(
    prompts: list[list[int]], max_new: int, dtype: str, model_dir: Path, attention: str
) -> dict:
    with stack(dtype, drafter=True, attention=attention) as s:
        client = Client(s.router_address)
        throughput(client, prompts[:2], 1, 16, True)
        prefill_once(client, prompts)
        before = step_timing(client, kind="speculative")
        spec, spec_out = throughput(client, prompts, 1, max_new, True)
        spec["round_ms"] = step_timing(client, before, "speculative")
        before = step_timing(client)
        plain, plain_out = throughput(client, prompts, 1, max_new, False)
        plain["step_timing_ms"] = step_timing(client, before)
        client.close()
    differences = []
    for i, (a, b) in enumerate(zip(spec_out, plain_out, strict=True)):
        if a != b:
            first = next(j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
            gap = top2_gap(model_dir, dtype, prompts[i], b[:first])
            differences.append({"prompt": i, "first_difference": first, "top2_gap": gap})
    print(f"{dtype}: spec {spec['tok_s']:.1f} vs {plain['tok_s']:.1f} tok/s, "
          f"{len(differences)} of {len(prompts)} outputs differ")  # fmt: skip
    return {
        "dtype": dtype,
        "speculative": spec,
        "target_only": plain,
        "ratio": spec["tok_s"] / plain["tok_s"],
        "num_prompts": len(prompts),
        "num_equal": len(prompts) - len(differences),
        "differences": differences,
    }


def mixed_batches_phase(
    prompts: list[list[int]], max_new: int, batches: list[int], attention: str, exact: bool
) -> list[dict]:
    """bf16, speculation on against off in batches of each size, the prompts in one shuffled
    order for the first run and another for the second (so each prompt's batch-mates differ):
    outputs compared prompt by prompt, no tie allowance (issue: exact in bf16)."""
    rows = []
    with stack("bfloat16", drafter=True, attention=attention, exact=exact) as s:
        client = Client(s.router_address)
        throughput(client, prompts[:2], 1, 16, True)
        prefill_once(client, prompts)
        for batch in batches:
            outputs = {}
            for speculate, seed in ((True, 1), (False, 2)):
                order = list(range(len(prompts)))
                random.Random(seed + batch).shuffle(order)
                shuffled = [prompts[i] for i in order]
                kind = "speculative" if speculate else "target_only"
                before = step_timing(client, kind=kind)
                row, out = throughput(client, shuffled, batch, max_new, speculate)
                row["step_timing_ms"] = step_timing(client, before, kind)
                outputs[speculate] = {i: ids for i, ids in zip(order, out, strict=True)}
                rows.append({"batch": batch, "speculate": speculate, **row})
                print(json.dumps(rows[-1]), flush=True)  # kept in the log if a later batch fails
            equal = sum(outputs[True][i] == outputs[False][i] for i in range(len(prompts)))
            rows[-1]["num_equal"], rows[-1]["num_prompts"] = equal, len(prompts)
            print(f"mixed batches of {batch}: {equal} of {len(prompts)} outputs equal")
        client.close()
    return rows


def steps_phase() -> list[dict]:
    import torch

    from benchmarks.gpu_steps import shape_report

    return [
        shape_report("smollm2-135m", torch.bfloat16, 256, [1, 8, 32]),
        shape_report("llama-8b", torch.bfloat16, 1024, [1]),
    ]


def cudnn_phase() -> list[dict]:
    from benchmarks.gpu_steps import cudnn_pathology

    return cudnn_pathology()


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = json.loads(args.prompts.read_text())["sharegpt_heldout"]
    prompts = chat_ids(texts)
    from model_runtime.loading import default_model_path

    gguf = default_model_path()
    report: dict[str, Any] = {"date": utc_now(), "commit": git_commit(), "gpu": _gpu_name(),
                              "target_extra": gpu_stack.TARGET_EXTRA}  # fmt: skip
    phases = [
        ("steps", steps_phase),
        ("cudnn", cudnn_phase),
        ("target_only", lambda: gpu_target_only.phase(prompts, args.max_new_tokens,
                                                      args.batches, args.target_only)),
        ("hf_eager", lambda: hf_eager_tok_s(gguf, prompts[:4], args.max_new_tokens)),
        ("hf_static_graph", lambda: hf_graph_tok_s(gguf, prompts[:8], args.max_new_tokens)),
        ("spec_fp32", lambda: speculation_phase(prompts[:4], args.max_new_tokens, "float32", gguf,
                                                args.attention)),
        ("spec_bf16", lambda: speculation_phase(prompts[: args.num_bf16], args.max_new_tokens,
                                                "bfloat16", gguf, args.attention)),
        ("tree_shapes", lambda: gpu_spec_phases.tree_shapes(prompts[:8],
                                                            args.max_new_tokens, args.attention)),
        ("prompt_sets", lambda: gpu_spec_phases.prompt_sets(
            prompt_set_ids(args.prompts, args.num_bf16), args.max_new_tokens, args.attention,
            args.prompt_set_trees)),
        ("switch", lambda: gpu_spec_phases.switch_batches(prompts, args.max_new_tokens,
                                                          [1, 4, 16, 64], args.attention)),
        ("exact_cost", lambda: gpu_spec_phases.exact_cost(prompts[: args.num_bf16],
                                                          args.max_new_tokens, args.attention)),
        ("mixed_batches", lambda: mixed_batches_phase(prompts[: args.num_bf16],
                                                      args.max_new_tokens, args.batches,
                                                      args.attention, args.exact)),
        ("bursty", lambda: gpu_spec_phases.bursty(prompts[: args.num_bursts],
                                                  args.max_new_tokens, args.burst_gap,
                                                  args.attention)),
    ]  # fmt: skip
    for name, phase in phases:
        if args.only and name not in args.only:
            continue
        started = time.monotonic()
        try:
            report[name] = phase()
        except Exception as err:  # one failed phase must not lose the others' figures
            report[name] = {"error": f"{type(err).__name__}: {err}"}
            print(f"{name} failed: {err}", file=sys.stderr)
        report[f"{name}_s"] = round(time.monotonic() - started, 1)
        args.out.write_text(json.dumps(report, indent=1))
    return report


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "none"


def write_prompts(path: Path) -> None:
    from benchmarks.bench_speculative import humaneval, sharegpt_heldout

    path.write_text(
        json.dumps({"sharegpt_heldout": sharegpt_heldout(64), "humaneval": humaneval(20)})
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--prompts", type=Path)
    parser.add_argument("--write-prompts", type=Path)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--num-bf16", type=int, default=20, help="prompts of the bf16 check")
    parser.add_argument("--num-bursts", type=int, default=10,
                        help="prompts of the bursty phase (each sent twice, alone)")
    parser.add_argument("--burst-gap", type=float, default=3.0,
                        help="seconds of quiet before each of the bursty phase's requests")
    parser.add_argument("--attention", default="torch", help="target backend of the spec phases")
    parser.add_argument("--exact", action="store_true", help="the mixed-batch phase's target "
                        "runs --exact")
    parser.add_argument("--only", nargs="*", default=None, help="run only these phases")
    parser.add_argument("--draft-dtype", default="bfloat16", help="the EAGLE drafters' dtype")
    parser.add_argument("--max-tree-tokens", type=int, default=None,
                        help="the routers' and targets' largest tree (default theirs: 64)")
    parser.add_argument("--prompt-set-trees", nargs="+", default=[(5, 4, 16), (8, 8, 64)],
                        type=lambda t: tuple(map(int, t.split(","))),
                        help="trees of the prompt_sets phase, as steps,topk,tokens")
    parser.add_argument("--target-only", nargs="+", default=list(gpu_target_only.VARIANTS),
                        choices=list(gpu_target_only.VARIANTS), help="target-only stacks to time")
    parser.add_argument("--decode-steps", type=int, default=None, help="the targets' "
                        "--decode-steps (multi-step decoding; default theirs: 8 on CUDA)")
    parser.add_argument("--keep-cpus-awake", choices=cpu_wake.MODES, default=None,
                        help="the targets' --keep-cpus-awake (one holder a stack; default off)")
    parser.add_argument("--router-log-level", default=None, help="the routers' --log-level "
                        "(debug: a line per decode step, the switch's view of it)")
    args = parser.parse_args(argv)
    if args.decode_steps is not None:
        gpu_stack.TARGET_EXTRA[:] = ["--decode-steps", str(args.decode_steps)]
    if args.keep_cpus_awake:
        gpu_stack.TARGET_EXTRA.extend(["--keep-cpus-awake", args.keep_cpus_awake])
    gpu_stack.DRAFT_DTYPE[:] = [args.draft_dtype]
    if args.max_tree_tokens is not None:
        gpu_stack.ROUTER_EXTRA[:] = ["--max-tree-tokens", str(args.max_tree_tokens)]
        gpu_stack.TARGET_EXTRA.extend(gpu_stack.ROUTER_EXTRA)
    if args.router_log_level:
        gpu_stack.ROUTER_EXTRA.extend(["--log-level", args.router_log_level])
    if args.write_prompts:
        write_prompts(args.write_prompts)
        return 0
    report = run(args)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
