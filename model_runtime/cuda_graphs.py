"""What the graph runners (the target's decode and verify, the drafter's tree search) share:
buckets, capture into one memory pool with a progress bar, the log line of its cost, and the
timed replay."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import nullcontext
from typing import TypeVar

import torch

from model_runtime.device_clock import DeviceClock
from plumbing.logs import progress_bars

log = logging.getLogger("splitspec.graphs")
# A graph's shape: the arguments of the runner's body that it was captured with.
ShapeT = TypeVar("ShapeT", bound=tuple[Hashable, ...])


def bucket_for(size: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= size), None)


def replay_or_run(
    graphs: Mapping[ShapeT, torch.cuda.CUDAGraph],
    shape: ShapeT,
    body: Callable[..., None],
    clock: DeviceClock | None,
) -> None:
    """The shape's captured graph, or its body eagerly (no graphs: CPU, --no-cuda-graphs),
    timed on the device by ``clock`` when the runner has one."""
    graph = graphs.get(shape)
    with clock.region() if clock is not None else nullcontext():
        if graph is not None:
            graph.replay()
        else:
            body(*shape)


def capture_graph(device: torch.device, pool, body: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """One warm-up run on a side stream (lazy inits and Triton compiles stay out of the
    capture), then the captured run."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        body()
    return graph


def capture_shapes(
    shapes: Sequence[ShapeT],
    what: str,
    device: torch.device,
    body_for: Callable[..., None],
) -> dict[ShapeT, torch.cuda.CUDAGraph]:
    """A graph per shape (largest first, so the smaller ones reuse the pool's memory), with a
    progress bar and one log line of the time and memory it took."""
    started = time.monotonic()
    # A graph freed while another is being captured cannot be reset (CUDA refuses the call
    # during a capture): collect unreachable graphs first, and no collection during captures.
    gc.collect()
    torch.cuda.synchronize(device)
    free_before = torch.cuda.mem_get_info(device)[0]
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[ShapeT, torch.cuda.CUDAGraph] = {}
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.inference_mode():
            for shape in progress(list(shapes), f"capturing {what} graphs"):
                # mypy cannot type a lambda with a default argument (this one is () -> None)
                graphs[shape] = capture_graph(device, pool, lambda s=shape: body_for(*s))  # type: ignore[misc]
    finally:
        if collecting:
            gc.enable()
    used = (free_before - torch.cuda.mem_get_info(device)[0]) / 2**20
    log.info(
        "captured %d %s graphs in %.1f s (%.0f MiB)", len(graphs), what,
        time.monotonic() - started, used,
    )  # fmt: skip
    return graphs


def progress(items: list, description: str):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dependency; stay quiet rather than fail without it
        return items
    # Under --log-format json the bar would break the one-object-a-line stream; the log line
    # after the capture still says how many graphs took how long.
    return tqdm(items, desc=description, unit="graph", leave=False, disable=not progress_bars())
