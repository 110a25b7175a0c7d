"""Shared pieces of the speculative-decoding tests (tests/test_spec_*.py).

- Stacks of real processes (target, draft replicas, router) on the tiny Llama of
  tests/helpers/tiny_llama.py (its fixtures are re-exported here).
- A small gRPC client that keeps every stream item, and request builders.

Fixtures (``*_fixture``, used under their ``name``) are imported into the test modules that use
them.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc

from protos import generation_pb2 as pb
from router.tokenizer import Tokenizer
from splitspec.launcher import LocalStack
from tests.helpers import rpc
from tests.helpers.rpc import Stream
from tests.helpers.tiny_llama import (  # noqa: F401 (fixtures re-exported to the spec tests)
    oracle_head_dir_fixture,
    tiny_model_dir_fixture,
)

START_TIMEOUT_S = 300.0
GENERATE_TIMEOUT_S = 240.0
FP64 = ["--device", "cpu", "--dtype", "float64"]


# ---- stacks ------------------------------------------------------------------------------


def start_stack(
    log_dir: Path,
    model_dir: Path,
    drafts: Sequence[Sequence[str]] = (),
    target_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    router_model_dir: Path | None = None,
) -> LocalStack:
    """Target, draft replicas and router on ``model_dir`` in fp64 on the CPU.

    Each draft entry is a replica's own arguments (``--method ...``); eagle replicas get the
    model and dtype here. The router reads its tokenizer from ``router_model_dir`` when given
    (e.g. one with other EOS ids). Returns once the router sees every replica healthy.
    """
    draft_args = []
    for args in drafts:
        args = list(args)
        if "eagle" in args:
            args += ["--model", str(model_dir), *FP64]
        draft_args.append(args)
    # The target on torch's default threads: with a 49152-word vocabulary the LM head and the
    # sampling filter over it are most of a step here, and they split over the cores
    # (test_spec_lossless 64 -> 52 s on 2 cores).
    stack = LocalStack(
        ["--model", str(model_dir), *FP64, *target_args],
        ["--model", str(router_model_dir or model_dir), *router_args],
        log_dir=log_dir,
        draft_args=draft_args,
    )
    return stack.start(timeout_s=START_TIMEOUT_S)


@contextlib.contextmanager
def running_stack(
    log_dir: Path,
    model_dir: Path,
    drafts: Sequence[Sequence[str]] = (),
    target_args: Sequence[str] = (),
    router_args: Sequence[str] = (),
    router_model_dir: Path | None = None,
) -> Iterator[tuple[LocalStack, Router]]:
    """A started stack and a client of its router; both closed on exit, whatever happened."""
    stack = start_stack(log_dir, model_dir, drafts, target_args, router_args, router_model_dir)
    router = Router(stack.router_address)
    try:
        yield stack, router
    finally:
        router.close()
        stack.stop()


# ---- the client ----------------------------------------------------------------------------


class Router(rpc.Router):
    """The public API's client (tests/helpers/rpc.py) with the spec stacks' longer deadline for
    a whole stream: their float64 steps on the tiny model are slow on a shared 2-core box."""

    def generate(
        self, request: pb.GenerateRequest, timeout_s: float = GENERATE_TIMEOUT_S
    ) -> Stream:
        return super().generate(request, timeout_s)

    def generate_many(
        self, requests: Sequence[pb.GenerateRequest], timeout_s: float = GENERATE_TIMEOUT_S
    ) -> list[Stream]:
        return super().generate_many(requests, timeout_s)


def ids_request(
    ids: Sequence[int],
    max_new_tokens: int,
    speculate: bool,
    *,
    request_id: str = "",
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    ignore_eos: bool = False,
) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=request_id)
    req.input_ids.ids.extend(ids)
    req.sampling.max_new_tokens = max_new_tokens
    req.sampling.temperature = temperature
    req.sampling.top_k = top_k
    req.sampling.top_p = top_p
    req.sampling.stop.extend(stop)
    req.sampling.stop_token_ids.extend(stop_token_ids)
    req.sampling.ignore_eos = ignore_eos
    if seed is not None:
        req.sampling.seed = seed
    req.speculation.enabled = speculate
    return req


# ---- text ----------------------------------------------------------------------------------


def stop_string_at(tokenizer: Tokenizer, ids: list[int], end: int) -> str | None:
    """The shortest text of ids[start : end + 1] whose first occurrence in the output's text
    completes with token ``end``; None when there is none. In a loop of period P the string
    has to reach back before the loop, so it can be longer than P tokens."""
    upto = tokenizer.decode(ids[: end + 1])
    if "\ufffd" in upto:
        return None
    text_before_end = tokenizer.decode(ids[:end])
    for start in range(end - 1, max(end - 64, 0) - 1, -1):
        before = tokenizer.decode(ids[:start])
        if not upto.startswith(before):
            continue
        stop = upto[len(before) :]
        first_at_end = upto.find(stop) == len(upto) - len(stop)
        if stop.strip() and first_at_end and text_before_end.find(stop) < 0:
            return stop
    return None


# ---- in-process references ----------------------------------------------------------------


@functools.cache
def load_fp64(model_dir: Path):  # -> LlamaForCausalLM (torch imported lazily); shared, eval only
    import torch

    from model_runtime.loading import load_model

    return load_model(model_dir, torch.float64, torch.device("cpu"), model_dir)


def load_copy(model_dir: Path, device: str, dtype):  # -> LlamaForCausalLM, the caller's own
    """A private copy of the shared model in ``dtype`` on ``device`` (``load_fp64``'s is
    shared: moving it would change it under every other test)."""
    import copy

    return copy.deepcopy(load_fp64(model_dir)).to(device=device, dtype=dtype)


def greedy_reference(
    model_dir: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy continuations (EOS ignored) from a TargetEngine in this process, fp64."""
    from target_service.config import TargetConfig
    from target_service.engine import StepItem, TargetEngine
    from target_service.request_table import SamplingSpec

    total = sum(len(p) + max_new_tokens for p in prompts)
    config = TargetConfig(
        model_path=model_dir,
        cache_dir=model_dir,
        dtype="float64",
        num_slots=total,
        max_requests=len(prompts),
        max_batch_tokens=total,
    )
    engine = TargetEngine(config, load_fp64(model_dir))
    rids = [f"ref-{i}" for i in range(len(prompts))]
    first, items = 0, []
    for rid, prompt in zip(rids, prompts, strict=True):
        size = len(prompt) + max_new_tokens
        items.append(
            StepItem(
                rid,
                list(prompt),
                0,
                list(range(first, first + size)),
                True,
                SamplingSpec(0.0, 1.0, 0, 0),
            )
        )
        first += size
    out = [[t] for t in engine.forward(items).next_token_ids]
    for step in range(1, max_new_tokens):
        items = [
            StepItem(rid, [ids[-1]], len(p) + step - 1, [], True)
            for rid, p, ids in zip(rids, prompts, out, strict=True)
        ]
        for ids, token in zip(out, engine.forward(items).next_token_ids, strict=True):
            ids.append(token)
    return out


def hidden_states(model_dir: Path, ids: Sequence[int]):  # -> torch.Tensor [len(ids), hidden]
    """The target's hidden rows of ``ids`` (last layer, before the final norm) from one plain
    causal forward of the model in this process, on fresh pools."""
    import torch

    from model_runtime.attention import build_metadata
    from model_runtime.pools import SlotPools

    model = load_fp64(model_dir)
    num = len(ids)
    pools = SlotPools(model.config, num, torch.float64, torch.device("cpu"))
    slots = torch.arange(num)
    meta = build_metadata(slots, slots[None, :], torch.tensor([0]), torch.tensor([num]), num)
    with torch.inference_mode():
        return model(torch.tensor(list(ids)), slots, (pools.k, pools.v), meta)


# ---- prompts -------------------------------------------------------------------------------


def random_prompts(seed: int, count: int, vocab_size: int, max_len: int = 300) -> list[list[int]]:
    """Prompts of 1..max_len random ids; every third one repeats a short random phrase, so a
    prompt-lookup drafter finds matches. Lengths include both extremes."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        length = 1 if i == 0 else max_len if i == 1 else rng.randint(1, max_len)
        if i % 3 == 2:
            phrase = [rng.randrange(vocab_size) for _ in range(rng.randint(2, 12))]
            ids = (phrase * (length // len(phrase) + 1))[:length]
        else:
            ids = [rng.randrange(vocab_size) for _ in range(length)]
        prompts.append(ids)
    return prompts


def wait_serving(router: Router, timeout_s: float = 60.0) -> None:
    """Until a one-token request succeeds (the router refuses them while the target is lost)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            router.generate(ids_request([1, 2, 3], 1, False), 10)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
