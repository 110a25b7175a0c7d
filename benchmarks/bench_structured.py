"""What structured output costs through the whole stack, and what it buys.

  python -m benchmarks.bench_structured [--task instructions|extraction|tools|auto]
                                        [--device cuda --dtype bfloat16] [--prompts 12]

One stack (router, target, one EAGLE replica on the same device) serves batch-1 greedy
requests, replies ending at EOS or max_new_tokens. Two tasks:

- ``instructions`` (the default): the hand-written short instructions (benchmarks/data), each
  with " Answer in JSON." appended. Four arms: speculation off and on, each free and with
  ``json_object`` (any JSON object).
- ``extraction``: a sentence about a person (benchmarks/data/extraction.json) and a request
  for four fields, held to that file's JSON Schema, whose keys the format forces. Six arms:
  speculation off and on, each free, with the schema, and with the schema but without its
  forced tokens verified (``SpeculationOptions.forced_drafts`` false: none in the draft trees,
  router/grammar_tree.py, nor target-only chains of them, router/forced_steps.py).
- ``tools``: a question for one of two tools (benchmarks/data/tool_calls.json), sent as the
  OpenAI API sends ``tool_choice: required`` (router/openai_api/tools.py builds the request:
  the tools in the prompt, the reply held to a call of either), so the call's markup, the
  function's name and the argument keys are forced. Four arms: speculation off and on, each
  with and without the forced tokens verified.
- ``auto``: the same questions with ``tool_choice: auto`` and the tools ``strict``, whose
  grammar leaves the text free and checks a call once the model opens one
  (router/openai_api/tool_grammar.py). The default model mostly answers in prose, so this is
  what the check costs a reply that calls nothing.
  Four arms: speculation off and on, each with the request's grammar and without it (the same
  prompt, unconstrained, as vLLM's ``auto`` runs).

Arms run interleaved prompt by prompt, their order turned a place each prompt, every prompt in
the radix cache first (as in bench_logprobs.py); an arm's tok/s is its tokens over its
streams' wall time. Target-only, a constrained arm decodes multi-step bursts without the mask,
cut where the format refuses a token (router/grammar_bursts.py; ``--grammar-bursts off``: one
masked decode step a Forward, as before 2026-12-05 04:00), and with speculation the router
computes a mask per verified position, so their tok/s are compared with the free arms'.

Recorded: tok/s, mean acceptance and forced draft tokens per arm; how many replies parse as a
JSON object and how many ``<tool_call>`` blocks they open; whether speculation gives exactly
target-only's tokens under the constraint (greedy); for ``auto``, how many replies the grammar
left as they were; the router's count of bursts run and cut.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from benchmarks.gpu_stack import INSTRUCTIONS, chat_ids
from benchmarks.interleaved import bench_args, run_on_stack
from benchmarks.run_record import git_commit, machine_info, utc_now, versions
from protos import generation_pb2 as pb
from splitspec.client import Client, GenerationResult, build_request

RESULTS = Path(__file__).resolve().parent / "results"
EXTRACTION = Path(__file__).resolve().parent / "data" / "extraction.json"
TOOL_CALLS = Path(__file__).resolve().parent / "data" / "tool_calls.json"
ASK_FIELDS = " Give the name, birth year (born), city and occupation as JSON."


NO_FORMAT = pb.StructuredOutput()  # an arm that drops a whole request's own format


def task(name: str) -> tuple[list, dict[str, tuple]]:
    """The task's prompts (token ids, or a whole request) and arms: name -> (speculate,
    format or None, forced drafts)."""
    if name == "auto":
        return tool_requests("auto"), {
            "base_free": (False, NO_FORMAT, True), "base_checked": (False, None, True),
            "spec_free": (True, NO_FORMAT, True), "spec_checked": (True, None, True),
        }  # fmt: skip
    if name == "tools":
        return tool_requests("required"), {
            "base_call": (False, None, True), "base_unforced": (False, None, False),
            "spec_call": (True, None, True),
            "spec_unforced": (True, None, False),
        }  # fmt: skip
    if name == "instructions":
        texts = json.loads(INSTRUCTIONS.read_text())["prompts"]
        fmt = pb.StructuredOutput(json_object=True)
        return chat_ids([f"{t} Answer in JSON." for t in texts]), {
            "base_free": (False, None, True), "base_json": (False, fmt, True),
            "spec_free": (True, None, True), "spec_json": (True, fmt, True),
        }  # fmt: skip
    data = json.loads(EXTRACTION.read_text())
    fmt = pb.StructuredOutput(json_schema=json.dumps(data["schema"]))
    return chat_ids([t + ASK_FIELDS for t in data["prompts"]]), {
        "base_free": (False, None, True), "base_schema": (False, fmt, True),
        "base_unforced": (False, fmt, False),
        "spec_free": (True, None, True), "spec_schema": (True, fmt, True),
        "spec_unforced": (True, fmt, False),
    }  # fmt: skip


def tool_requests(choice: str) -> list[pb.GenerateRequest]:
    """Each question as the chat API turns it into a request with ``tool_choice``."""
    from router.openai_api.protocol import parse_chat  # the router's, torch-free

    data = json.loads(TOOL_CALLS.read_text())
    tools = [{**t, "function": {**t["function"], "strict": True}} for t in data["tools"]]
    return [
        parse_chat({"messages": [{"role": "user", "content": question}], "tools": tools,
                    "tool_choice": choice, "parallel_tool_calls": False}).generate
        for question in data["questions"]
    ]  # fmt: skip


def one_request(
    client: Client, prompt, max_new: int, speculate: bool, fmt, forced: bool
) -> GenerationResult:
    """A batch-1 greedy request for ``prompt`` (token ids, free or held to ``fmt``; or a
    whole request, with its own format unless ``fmt`` replaces it)."""
    request = build_request("", False, max_new, 0.0, speculate=speculate, structured_output=fmt)
    if isinstance(prompt, pb.GenerateRequest):
        request.ClearField("input")
        request.messages.CopyFrom(prompt.messages)
        own = prompt.sampling.structured_output
        request.sampling.structured_output.CopyFrom(own if fmt is None else fmt)
    else:
        request.input_ids.ids.extend(prompt)
    request.speculation.forced_drafts = forced
    return client.generate(request)


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def summarize(results: dict[str, list[GenerationResult]]) -> dict:
    rows = {name: arm_row(runs) for name, runs in results.items()}
    for name, row in rows.items():
        free = rows.get(name.split("_")[0] + "_free")
        if free is not None:
            row["ratio_to_free"] = row["tok_s"] / free["tok_s"]
    return rows


def arm_row(runs: list[GenerationResult]) -> dict:
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    finals = [r.final for r in runs if r.final is not None]
    accepted = [f.speculation.mean_acceptance_length for f in finals]
    return {
        "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
        "mean_acceptance_length": sum(accepted) / max(1, len(accepted)),
        "forced_tokens": sum(f.speculation.forced_tokens for f in finals),
        "json_objects": f"{sum(is_json_object(r.text) for r in runs)}/{len(runs)}",
        "tool_call_blocks": sum(r.text.count("<tool_call>") for r in runs),
        "ended_at_eos": sum(f.finish_reason == pb.FINISH_REASON_EOS for f in finals),
        "reply_digests": [reply_digest(r.token_ids) for r in runs],  # to compare runs by
    }  # fmt: skip


def reply_digest(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:12]


def equal_to_target_only(results: dict[str, list[GenerationResult]]) -> dict[str, str]:
    """Each other constrained arm's replies equal to constrained target-only's (the first
    constrained arm without speculation)."""
    constrained = [name for name in results if not name.endswith("_free")]
    base = results[constrained[0]]
    return {
        name: f"{sum(s.token_ids == b.token_ids for s, b in zip(results[name], base, strict=True))}"
        f"/{len(base)}"
        for name in constrained[1:]
    }


def checked_equals_free(results: dict[str, list[GenerationResult]]) -> dict[str, str]:
    """auto: each checked arm's replies equal to its free arm's (a reply that calls nothing, or
    calls well, is the same text with or without the grammar)."""
    return {
        name: f"{sum(c.token_ids == f.token_ids for c, f in zip(runs, free, strict=True))}"
        f"/{len(runs)}"
        for name, runs in results.items()
        if name.endswith("_checked") and (free := results.get(name.split("_")[0] + "_free"))
    }


def add_task(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", choices=("instructions", "extraction", "tools", "auto"),
                        default="instructions", help="prompts and format (docstring)")
    parser.add_argument("--grammar-bursts", choices=("on", "off"), default="on",
                        help="the router's flag: greedy constrained requests decode unmasked "
                        "multi-step bursts (router/grammar_bursts.py)")  # fmt: skip


def main() -> None:
    args = bench_args(__doc__.splitlines()[0], add_task)
    prompts, arms = task(args.task)
    prompts = prompts[: args.prompts]
    bursts = ["--grammar-bursts", args.grammar_bursts]
    results, status = run_on_stack(args, prompts, arms, one_request, bursts)
    record = {
        "benchmark": "structured_output", "task": args.task, "when": utc_now(),
        "commit": git_commit(), "device": args.device, "grammar_bursts": args.grammar_bursts,
        "bursts_run": status.grammar_bursts, "bursts_cut": status.grammar_bursts_cut,
        "dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
        "arms": summarize(results), "spec_equals_target_only": equal_to_target_only(results),
        "checked_equals_free": checked_equals_free(results),
        "machine": machine_info(0), "versions": versions(),
    }  # fmt: skip
    shown = ("arms", "spec_equals_target_only", "checked_equals_free", "bursts_run", "bursts_cut")
    print(json.dumps({k: record[k] for k in shown}, indent=1))
    stamp = record["when"][:16].replace(":", "").replace("T", "_")
    name = "structured" if args.task == "instructions" else f"structured_{args.task}"
    name += "" if args.grammar_bursts == "on" else "_no_bursts"
    out = args.out or RESULTS / f"{name}_{args.device}_{stamp}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
