"""The GPU benchmark's stacks and what it asks them: a stack per configuration (router, CUDA
target, optional drafter), greedy requests on the router's own chat template, closed-group
throughput, and the router's step timings from GetServerStatus.

The extras below are set once by bench_gpu's command line and read by every stack any phase
builds (tree_shapes, prompt_sets, switch and the rest): they live here, in the module the
phases import, so the entry script run as __main__ cannot hold a second copy of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.common import run_concurrent
from splitspec.client import Client, build_request
from splitspec.launcher import LocalStack

TARGET_EXTRA: list[str] = []  # --decode-steps N, for every stack's target
DRAFT_DTYPE = ["bfloat16"]  # --draft-dtype, for every stack's EAGLE drafter
ROUTER_EXTRA: list[str] = []  # --max-tree-tokens N, for every stack's router (and target)


def stack(
    dtype: str,
    drafter: bool,
    graphs: bool = True,
    attention: str = "torch",
    exact: bool = False,
    tree: tuple[int, int, int] | None = None,
    router: list[str] | None = None,
    target_extra: list[str] | None = None,
    ngram: bool = False,
) -> LocalStack:
    """``ngram``: the drafter is the n-gram one, on the CPU (its own tree default there)."""
    target = ["--device", "cuda", "--dtype", dtype, "--attention", attention]
    target += ([] if graphs else ["--no-cuda-graphs"]) + (["--exact"] if exact else [])
    target += TARGET_EXTRA + (target_extra or [])  # argparse: the last --decode-steps wins
    draft = ["--method", "eagle", "--device", "cuda", "--dtype", DRAFT_DTYPE[0]]
    if ngram:
        draft = ["--method", "ngram"]
    if tree is not None:
        draft += [f"--{k}={v}" for k, v in zip(TREE_FLAGS, tree, strict=True)]
    drafts = [draft] if drafter else []
    tree_name = "-".join(map(str, tree or ()))
    log_dir = Path(f"/tmp/bench-gpu-{dtype}-{attention}-{int(drafter)}-{int(graphs)}-{int(exact)}")
    log_dir = log_dir.with_name(log_dir.name + ("-ngram" if ngram else ""))
    log_dir = log_dir.with_name(log_dir.name + (f"-tree{tree_name}" if tree else ""))
    for extra in (router, target_extra):
        log_dir = log_dir.with_name(log_dir.name + "".join(extra or []))
    log_dir.mkdir(parents=True, exist_ok=True)
    return LocalStack(target, (router or []) + ROUTER_EXTRA, log_dir=log_dir,
                      draft_args=drafts)  # started by `with`


TREE_FLAGS = ("num-steps", "topk", "num-draft-tokens")


def chat_ids(prompts: list[str]) -> list[list[int]]:
    """The router's own chat template, applied here so that every engine gets the same ids."""
    from model_runtime.loading import default_model_path
    from router.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_model_path(str(default_model_path()))
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]


def greedy_requests(
    prompts: list[list[int]], max_new: int, speculate: bool | None, ignore_eos: bool = True
) -> list:
    """By default every stream runs its whole length (EOS ignored), so batches stay full and
    runs compare; acceptance wants the replies as they end (``ignore_eos=False``)."""
    requests = [build_request("", False, max_new, 0.0, speculate=speculate) for _ in prompts]
    for request, ids in zip(requests, prompts, strict=True):
        request.input_ids.ids.extend(ids)
        request.sampling.ignore_eos = ignore_eos
    return requests


def throughput(
    client: Client,
    prompts: list[list[int]],
    batch: int,
    max_new: int,
    spec: bool | None = None,
    ignore_eos: bool = True,
) -> tuple[dict, list[list[int]]]:
    """Closed groups of ``batch`` concurrent streams; tok/s over all groups' wall time, and
    every stream's token ids."""
    tokens, wall, outputs = 0, 0.0, []
    for start in range(0, len(prompts), batch):
        group = greedy_requests(prompts[start : start + batch], max_new, spec, ignore_eos)
        began = time.perf_counter()
        timings = run_concurrent(client, group)
        wall += time.perf_counter() - began
        tokens += sum(t.num_tokens for t in timings)
        outputs += [t.token_ids for t in timings]
    return {"batch": batch, "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}, outputs


def prefill_once(client: Client, prompts: list[list[int]]) -> None:
    """Every prompt prefilled once (one token, target-only, not counted), so that the arms
    after it find them all in the router's prefix cache alike. Without it the first arm pays
    every prompt's prefill and the arm after it none: the EAGLE-first GPU phases did so until
    2026-12-06 (on the 2-core CPU box that was a TTFT of 16-173 ms against 13-24)."""
    throughput(client, prompts, 1, 1, False)


def server_status(client: Client):  # -> pb.ServerStatus
    from protos import generation_pb2 as pb

    return client.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=30)


def step_timing(client: Client, before: dict | None = None, kind: str = "target_only") -> dict:
    """The router's mean decode step of one kind (``target_only`` or ``speculative``) and its
    parts (router/step_timing.py), over the steps since ``before`` (totals when None)."""
    from protos import generation_pb2 as pb

    status = client.stub.GetServerStatus(pb.GetServerStatusRequest(), timeout=30)
    t = getattr(status, f"{kind}_steps")
    totals = {"steps": t.steps, **{k: getattr(t, k) * t.steps for k in TIMING_FIELDS},
              "verify_steps": status.speculation.verify_steps,
              "accepted_tokens": status.speculation.accepted_tokens}  # fmt: skip
    if before is None:
        return totals
    steps = totals["steps"] - before["steps"]
    verify_steps = totals["verify_steps"] - before["verify_steps"]
    accepted = totals["accepted_tokens"] - before["accepted_tokens"]
    means = {k: (totals[k] - before[k]) / max(steps, 1) for k in TIMING_FIELDS}
    means["router_ms"] = means["step_ms"] - means["target_call_ms"] - means["draft_call_ms"]
    means["target_rpc_ms"] = means["target_call_ms"] - means["target_compute_ms"]
    means["draft_rpc_ms"] = means["draft_call_ms"] - means["draft_compute_ms"]
    device = means["target_device_ms"] + means["draft_device_ms"]
    means["not_device_share"] = 1 - device / means["step_ms"] if means["step_ms"] else 0.0
    # The router's own count over the finished requests: committed tokens per verify step.
    acceptance = (accepted + verify_steps) / verify_steps if verify_steps else 0.0
    return {"steps": steps, **means, "verify_steps": verify_steps,
            "mean_acceptance_length": acceptance}  # fmt: skip


TIMING_FIELDS = (
    "step_ms", "target_call_ms", "target_compute_ms", "draft_call_ms", "draft_compute_ms",
    "target_device_ms", "draft_device_ms",
)  # fmt: skip


INSTRUCTIONS = Path(__file__).parent / "data" / "short_instructions.json"


def prompt_set_ids(path: Path, count: int) -> dict[str, list[list[int]]]:
    """The first ``count`` prompts of each set: the file's ShareGPT and HumanEval ones, and
    the hand-written short instructions kept in the repo (benchmarks/data)."""
    texts = json.loads(path.read_text())
    texts["instructions"] = json.loads(INSTRUCTIONS.read_text())["prompts"]
    names = ("sharegpt_heldout", "humaneval", "instructions")
    return {name: chat_ids(texts[name][:count]) for name in names}
