"""Speculation phases of the GPU benchmark (benchmarks/bench_gpu.py runs them): EAGLE by tree
shape at batch 1, the router's adaptive switch at larger batches, each against target-only
on the same stack and prompts, what the target's exact mode costs EAGLE end to end, and
single requests with pauses between them (one user's load)."""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks.common import run_concurrent
from benchmarks.gpu_stack import (
    greedy_requests,
    prefill_once,
    server_status,
    stack,
    step_timing,
    throughput,
)
from splitspec.client import Client

# (steps, topk, tokens): the CPU default, then trees a GPU verifies for about the same cost.
# A chain first (top-1 at every level: EAGLE without a tree), then trees up to the default.
TREE_SHAPES: list[tuple[int, int, int]] = [(8, 1, 9), (5, 4, 16), (6, 6, 32), (8, 8, 64)]


def tree_shapes(prompts: list[list[int]], max_new: int, attention: str) -> list[dict]:
    """Batch 1, bf16: EAGLE's tok/s and tokens per verify step by tree shape (a chain among
    them), then the n-gram drafter's, each against target-only on the same stack and prompts
    (issue: trees sized for the device)."""

    rows = []
    shapes: list[tuple[int, int, int] | str] = [*TREE_SHAPES, "ngram"]
    for tree in shapes:
        ngram = tree == "ngram"
        shape = None if isinstance(tree, str) else tree
        with stack("bfloat16", drafter=True, attention=attention, tree=shape, ngram=ngram) as s:
            spec, timing, plain, equal = eagle_then_target_only(s.router_address, prompts, max_new)
        row = {"tree": tree, "tok_s": spec["tok_s"], "target_only_tok_s": plain["tok_s"],
               "ratio": spec["tok_s"] / plain["tok_s"], "num_equal": equal,
               "tokens_per_step": (spec["tokens"] - len(prompts)) / max(timing["steps"], 1),
               "round_ms": timing}
        rows.append(row)  # fmt: skip
        print(json.dumps(row), flush=True)
    return rows


def prompt_sets(
    sets: dict[str, list[list[int]]], max_new: int, attention: str, trees: list[tuple]
) -> list[dict]:
    """Batch 1, bf16: EAGLE against target-only and tokens per verify step, per prompt set
    (held-out ShareGPT, HumanEval, short instructions) and tree shape, one stack a tree.

    Replies end at EOS here (up to ``max_new`` tokens): acceptance is a property of the replies
    users get. With EOS ignored a stream runs on past the reply's end into text no head was
    trained on (an instruction's reply is often a few dozen tokens), which measured 3.07 tokens
    a step where the same replies, ended, give 3.6. A verify step commits its accepted drafts
    and the bonus token; each reply's first token comes from its prefill, not a verify step."""

    rows = []
    for tree in trees:
        with stack("bfloat16", drafter=True, attention=attention, tree=tree) as s:
            for name, prompts in sets.items():
                spec, timing, plain, equal = eagle_then_target_only(
                    s.router_address, prompts, max_new, ignore_eos=False
                )
                verified = spec["tokens"] - len(prompts)
                row = {"tree": tree, "prompt_set": name, "num_prompts": len(prompts),
                       "tok_s": spec["tok_s"], "target_only_tok_s": plain["tok_s"],
                       "ratio": spec["tok_s"] / plain["tok_s"], "tokens": spec["tokens"],
                       "tokens_per_step": verified / max(timing["steps"], 1),
                       "num_equal": equal, "round_ms": timing}  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def switch_batches(
    prompts: list[list[int]], max_new: int, batches: list[int], attention: str
) -> list[dict]:
    """bf16, router --adaptive-speculation: requests that leave speculation to the router
    against requests sent target-only, batch by batch (issue: never slower under load).

    The switch learns per batch bucket once per router, so each batch size runs its groups
    twice: the first pass (the learning included) and the second (what a running server
    serves), both reported against target-only on the same groups, all three with the
    prompts already in the prefix cache."""

    rows: list[dict] = []
    with stack("bfloat16", drafter=True, attention=attention,
               router=["--adaptive-speculation"]) as s:  # fmt: skip
        client = Client(s.router_address)
        throughput(client, prompts[:2], 1, 16, None)
        warm_up = _switch_buckets(client)  # what two short batch-1 streams taught it
        for batch in batches:
            # Four groups: a pass of two at batch 4 lasted ~0.3 s, where one slow moment
            # moved its ratio by a tenth.
            group = (prompts * (1 + 4 * batch // len(prompts)))[: 4 * batch]
            # Prefilled once first (one token each, target-only): else the first pass alone
            # pays the prompts' prefills, which the prefix cache spares the two after it.
            throughput(client, group, batch, 1, False)
            first, _ = throughput(client, group, batch, max_new, None)
            auto, _ = throughput(client, group, batch, max_new, None)
            plain, _ = throughput(client, group, batch, max_new, False)
            buckets = _switch_buckets(client)
            row = {"batch": batch, "auto_tok_s": auto["tok_s"], "target_only_tok_s":
                   plain["tok_s"], "ratio": auto["tok_s"] / plain["tok_s"],
                   "first_pass_tok_s": first["tok_s"],
                   "first_pass_ratio": first["tok_s"] / plain["tok_s"],
                   "switch": buckets}  # fmt: skip
            if not rows:
                row["switch_after_warm_up"] = warm_up
            rows.append(row)
            print(json.dumps(row), flush=True)
        client.close()
    return rows


def _switch_buckets(client: Client) -> list[dict]:
    from google.protobuf.json_format import MessageToDict


    switch = server_status(client).speculation_switch
    every = {"preserving_proto_field_name": True, "always_print_fields_with_no_presence": True}
    return [MessageToDict(b, **every) for b in switch.buckets]


def exact_cost(prompts: list[list[int]], max_new: int, attention: str) -> dict:
    """Batch 1, bf16, EAGLE and target-only on a default-numerics stack, then on an --exact
    one, same prompts, one run (issue: exact in bf16, what the mode costs end to end)."""

    rows: dict[str, Any] = {}
    for exact in (False, True):
        with stack("bfloat16", drafter=True, attention=attention, exact=exact) as s:
            spec, timing, plain, equal = eagle_then_target_only(s.router_address, prompts, max_new)
        rows["exact" if exact else "default"] = {
            "eagle_tok_s": spec["tok_s"], "target_only_tok_s": plain["tok_s"],
            "round_ms": timing, "num_equal": equal,
        }  # fmt: skip
        print(json.dumps(rows), flush=True)
    for kind in ("eagle_tok_s", "target_only_tok_s"):
        rows[f"{kind}_cost"] = rows["default"][kind] / rows["exact"][kind]
    rows["num_prompts"] = len(prompts)
    return rows


def eagle_then_target_only(
    address: str, prompts: list[list[int]], max_new: int, ignore_eos: bool = True
) -> tuple:
    """Batch 1 on a running stack: EAGLE (after a warm-up), its round timings, then
    target-only on the same prompts, and how many outputs the two share; the prompts in the
    prefix cache for both arms."""

    client = Client(address)
    throughput(client, prompts[:2], 1, 16, True)
    prefill_once(client, prompts)
    before = step_timing(client, kind="speculative")
    spec, spec_out = throughput(client, prompts, 1, max_new, True, ignore_eos)
    timing = step_timing(client, before, "speculative")
    plain, plain_out = throughput(client, prompts, 1, max_new, False, ignore_eos)
    client.close()
    equal = sum(a == b for a, b in zip(spec_out, plain_out, strict=True))
    return spec, timing, plain, equal


def bursty(prompts: list[list[int]], max_new: int, gap_s: float, attention: str) -> dict:
    """One user's load: each prompt alone after ``gap_s`` seconds of quiet, EAGLE and
    target-only in turn (which goes first alternates), on one stack. Against back-to-back
    streams this is where the idle-aware spinners of ``--keep-cpus-awake spin`` differ: they
    sleep after 2 s without work and come back 0.1-0.2 s into a request, so a short reply runs
    partly without them. Per kind: tok/s over the requests' own time (first byte to last),
    mean time to first token, and how many outputs the two kinds share."""

    with stack("bfloat16", drafter=True, attention=attention) as s:
        client = Client(s.router_address)
        throughput(client, prompts[:2], 1, 16, True)
        timings: dict[bool, list] = {True: [], False: []}
        for i, ids in enumerate(prompts):
            for spec in (True, False) if i % 2 == 0 else (False, True):
                time.sleep(gap_s)
                timings[spec] += run_concurrent(client, greedy_requests([ids], max_new, spec))
        client.close()
    eagle, plain = (_burst_figures(timings[k]) for k in (True, False))
    pairs = zip(timings[True], timings[False], strict=True)
    equal = sum(a.token_ids == b.token_ids for a, b in pairs)
    row = {"gap_s": gap_s, "num_prompts": len(prompts), "max_new_tokens": max_new,
           "eagle": eagle, "target_only": plain, "ratio": eagle["tok_s"] / plain["tok_s"],
           "num_equal": equal}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def _burst_figures(timings: list) -> dict:
    tokens = sum(t.num_tokens for t in timings)
    busy = sum(t.finished - t.submitted for t in timings)
    ttft = [1e3 * (t.first_token - t.submitted) for t in timings]
    return {"tokens": tokens, "tok_s": tokens / busy, "ttft_ms_mean": sum(ttft) / len(ttft),
            "ttft_ms_max": max(ttft)}  # fmt: skip
