"""One `splitspec bench` request as its client sees it, and what a run is set to do."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc

from protos import generation_pb2 as pb
from splitspec.client import Client, build_request, status_line

SPECULATE = {"target-only": False, "speculative": True, "server": None}


@dataclass
class Sample:
    """One request, as its client saw it."""

    prompt_index: int
    arm: str
    wave: int = 0  # the requests started together with it share its number
    sent_s: float = 0.0  # when it was sent, from its arm's start (open loop; waves: 0)
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    seconds: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, served from the router's prefix cache
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class BenchConfig:
    prompts: list[str]
    arms: tuple[str, ...]
    concurrency: int
    max_new_tokens: int
    temperature: float
    seed: int
    chat: bool
    request_rate: float | None = None  # requests a second, Poisson (None: waves)


def send_one(client: Client, config: BenchConfig, arm: str, index: int, wave: int) -> Sample:
    request = build_request(
        config.prompts[index], config.chat, config.max_new_tokens, config.temperature,
        seed=config.seed + index if config.temperature > 0 else None, speculate=SPECULATE[arm],
    )  # fmt: skip
    sample = Sample(index, arm, wave)
    started = time.perf_counter()
    try:
        for item in client.stream(request):
            if item.token_ids and not sample.token_ids:
                sample.ttft_s = time.perf_counter() - started
            sample.token_ids += item.token_ids
            if item.finish_reason:
                _take_final(sample, item)
    except grpc.RpcError as err:
        sample.error = status_line(err)
    sample.seconds = time.perf_counter() - started
    return sample


def _take_final(sample: Sample, item: pb.GenerateResponse) -> None:
    sample.prompt_tokens = item.usage.prompt_tokens
    sample.cached_tokens = item.usage.cached_tokens
    spec = item.speculation
    sample.verify_steps = spec.verify_steps
    sample.draft_tokens = spec.draft_tokens
    sample.accepted_tokens = spec.accepted_tokens
