"""The two engines the target-only benchmark (benchmarks/bench_target_only.py) measures, one
phase per batch size: splitspec's whole stack through its public API, and HF transformers
`generate` in this process. Each phase is measured quietly (benchmarks/quiet.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmarks.common import (
    Figures,
    Prompt,
    StreamTiming,
    chunks,
    run_concurrent,
    start_stack,
    summarize,
)
from benchmarks.quiet import CpuMeter, QuietPolicy, measure_quietly
from model_runtime.hf_gguf import memoized_gguf_reads
from protos import generation_pb2 as pb
from splitspec.client import Client, build_request


@dataclass(frozen=True)
class BenchConfig:
    model: Path
    out: Path
    num_prompts: int
    max_new_tokens: int
    batch_sizes: tuple[int, ...]
    warmup_tokens: int
    max_prompt_tokens: int
    threads: int
    quick: bool
    quiet: QuietPolicy


@dataclass
class Phase:
    """One engine at one batch size: its figures, CPU use and outputs."""

    engine: str
    batch_size: int
    figures: Figures
    cpu_s: dict[str, float]
    outputs: list[list[int]] = field(repr=False)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def other_cores(self) -> float:
        return self.cpu_s["others"] / self.figures.wall_s

    def as_dict(self) -> dict[str, Any]:
        busy = {k: round(v / self.figures.wall_s, 2) for k, v in self.cpu_s.items()}
        return {
            "engine": self.engine,
            "batch_size": self.batch_size,
            **self.figures.as_dict(),
            "cpu_s": self.cpu_s,
            "cpu_cores_busy": busy,
            **self.notes,
        }


# ---- splitspec -----------------------------------------------------------------------------------


def stack_request(prompt: Prompt, max_new_tokens: int) -> pb.GenerateRequest:
    request = build_request(prompt.text, chat=True, max_new_tokens=max_new_tokens, temperature=0.0)
    request.sampling.ignore_eos = True  # every request yields exactly max_new_tokens
    return request


def bench_stack(cfg: BenchConfig, prompts: list[Prompt], warmup: list[Prompt]) -> list[Phase]:
    # A fresh stack per batch size, so no phase finds the previous phase's prompts in the
    # radix cache; the warm-up still caches the shared system-prompt prefix, as in service.
    return [_quietly(cfg, partial(_stack_phase, cfg, b, prompts, warmup)) for b in cfg.batch_sizes]


def _quietly(cfg: BenchConfig, measure: Callable[[bool], Phase]) -> Phase:
    phase, attempts = measure_quietly(measure, cfg.quiet)
    phase.notes["attempts"] = attempts
    phase.notes["disturbed"] = phase.other_cores > cfg.quiet.max_other_cores
    return phase


def _stack_phase(
    cfg: BenchConfig,
    batch_size: int,
    prompts: list[Prompt],
    warmup: list[Prompt],
    may_abandon: bool,
) -> Phase:
    stack = start_stack(cfg.threads, model=cfg.model)
    try:
        with Client(stack.router_address) as client:
            run_concurrent(
                client, [stack_request(p, cfg.warmup_tokens) for p in warmup[:batch_size]]
            )
            meter = CpuMeter(stack)
            groups = _run_groups(
                f"splitspec b={batch_size}",
                prompts,
                batch_size,
                lambda g: run_concurrent(client, [stack_request(p, cfg.max_new_tokens) for p in g]),
                lambda: cfg.quiet.check(meter, may_abandon),
            )
            cpu = meter.elapsed()
    finally:
        stack.stop()
    streams = [s for g in groups for s in g]
    finals = [s.final for s in streams if s.final is not None]
    notes = {
        "cached_prompt_tokens": sum(f.usage.cached_tokens for f in finals),
        "prompt_token_mismatches": sum(
            f.usage.prompt_tokens != len(p.input_ids) for f, p in zip(finals, prompts, strict=True)
        ),
        "server_ttft_ms_mean": round(
            statistics.fmean(f.timings.time_to_first_token_ms for f in finals), 3
        ),
    }
    return Phase(
        "splitspec", batch_size, summarize(groups), cpu, [s.token_ids for s in streams], notes
    )


def _run_groups(
    desc: str,
    prompts: list[Prompt],
    batch_size: int,
    run: Callable[[Sequence[Prompt]], list[StreamTiming]],
    check: Callable[[], None],
) -> list[list[StreamTiming]]:
    groups: list[list[StreamTiming]] = []
    with tqdm(total=len(prompts), desc=desc, unit="req") as bar:
        for group in chunks(prompts, batch_size):
            groups.append(run(group))
            bar.update(len(group))
            check()
    return groups


# ---- HF transformers -----------------------------------------------------------------------------


class StepClock:
    """A logits processor that only records when each decoding step's logits were ready."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return scores


def hf_group(
    model: Any, tokenizer: Any, group: Sequence[Prompt], max_new_tokens: int
) -> list[StreamTiming]:
    from transformers import LogitsProcessorList

    batch = tokenizer.pad(
        {"input_ids": [p.input_ids for p in group]}, padding_side="left", return_tensors="pt"
    )
    clock = StepClock()
    submitted = time.perf_counter()
    out = model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        logits_processor=LogitsProcessorList([clock]),
    )
    finished = time.perf_counter()
    new_ids = out[:, batch["input_ids"].shape[1] :].tolist()
    # The first stamp follows the prefill forward: that is when the first token exists.
    return [StreamTiming(submitted, clock.stamps[0], finished, ids) for ids in new_ids]


def bench_hf(
    cfg: BenchConfig, tokenizer: Any, prompts: list[Prompt], warmup: list[Prompt]
) -> list[Phase]:
    from transformers import AutoModelForCausalLM

    with memoized_gguf_reads():  # the same model, without transformers' repeated parsing
        model = AutoModelForCausalLM.from_pretrained(
            cfg.model.parent, gguf_file=cfg.model.name, dtype=torch.float32
        ).eval()
    phases = []
    for b in cfg.batch_sizes:
        hf_group(model, tokenizer, warmup[:b], cfg.warmup_tokens)
        phases.append(_quietly(cfg, partial(_hf_phase, cfg, model, tokenizer, b, prompts)))
    return phases


def _hf_phase(
    cfg: BenchConfig,
    model: Any,
    tokenizer: Any,
    batch_size: int,
    prompts: list[Prompt],
    may_abandon: bool,
) -> Phase:
    meter = CpuMeter(None)
    groups = _run_groups(
        f"HF generate b={batch_size}",
        prompts,
        batch_size,
        lambda g: hf_group(model, tokenizer, g, cfg.max_new_tokens),
        lambda: cfg.quiet.check(meter, may_abandon),
    )
    return Phase(
        "hf",
        batch_size,
        summarize(groups),
        meter.elapsed(),
        [s.token_ids for g in groups for s in g],
        {"attn_implementation": model.config._attn_implementation},
    )
