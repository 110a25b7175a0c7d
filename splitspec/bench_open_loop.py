"""`splitspec bench --request-rate`: an open-loop load. Requests leave at Poisson arrival times
whatever pace the router keeps (as a service's users arrive), at most ``--concurrency`` in
flight when it is given. Under that cap an arrival waits for a slot, and the request's clock
(its TTFT, its request time, ``sent_s``) starts when it gets one, not at its arrival time, as
vLLM's ``--max-concurrency``: no request's times include that wait. A closed loop of waves
ends each wave with its slowest request, so a mode whose requests progress unevenly
(speculation: 1 to 9 tokens a round) pays a tail that a steady stream of arrivals does not
have.

Both arms get the same arrival times (one seed) and run one after the other."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from splitspec.bench_requests import BenchConfig, Sample, send_one
from splitspec.client import Client


def arrival_times(count: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each of ``count`` requests leaves: exponential gaps of
    mean 1 / ``rate``, the first at 0."""
    draw = random.Random(seed)
    times, at = [], 0.0
    for _ in range(count):
        times.append(at)
        at += draw.expovariate(rate)
    return times


def run_open_loop(
    client: Client, config: BenchConfig, arm: str, on_done: Callable[[], None]
) -> list[Sample]:
    """Every prompt once through ``arm`` at its arrival time; samples in prompt order."""
    assert config.request_rate is not None
    times = arrival_times(len(config.prompts), config.request_rate, config.seed)
    cap = threading.BoundedSemaphore(config.concurrency) if config.concurrency else None

    def send(index: int) -> Sample:
        try:
            return send_one(client, config, arm, index, wave=0)
        finally:
            if cap is not None:
                cap.release()
            on_done()

    sent: list[tuple[float, Future[Sample]]] = []
    # A thread per request in flight: a pool smaller than that would hold arrivals back.
    with ThreadPoolExecutor(config.concurrency or len(times)) as pool:
        start = time.perf_counter()
        for index, at in enumerate(times):
            time.sleep(max(0.0, start + at - time.perf_counter()))
            if cap is not None:
                cap.acquire()
            sent.append((time.perf_counter() - start, pool.submit(send, index)))
    samples = []
    for sent_s, future in sent:
        sample = future.result()
        sample.sent_s = sent_s
        samples.append(sample)
    return samples
