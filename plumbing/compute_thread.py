"""One thread for all of a service's model work: loading, steps, reads.

torch's CPU kernels run on OpenMP, which keeps a team of worker threads per calling thread.
When each gRPC handler thread runs model code, a process gathers several teams; once their
threads outnumber the cores, libgomp stops spinning between parallel regions and every region
pays a futex wake-up. On a 2-core CPU that turned a 43 ms decode step of the default model
into 70 ms. Running every model call on this one thread keeps a single team, and serializes
the calls, which the engines need anyway.

Where no team can form (`may_run_inline`), the hop itself is the waste: handing a call to this
thread and its answer back costs two thread wake-ups, ~0.2 ms a call on the 2-core dev box
(benchmarks/rpc_overhead.py). There `run_here` runs the call on the caller's own thread.
Either way every call takes one lock first, so no two ever run at once, whichever thread runs
them. A thread's own settings come from ``thread_setup``, once: a new thread's OpenMP
thread count is all the cores until torch applies its own setting there, which its small ops
never do, so the project's OpenMP kernels ran 16-thread teams in the handler threads of a
16-core box (``--threads 1``: the target's step 1.99 -> 2.23 ms).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def may_run_inline(device: str, num_threads: int) -> bool:
    """Whether model calls may run on the threads that take them (``run_here``): on CUDA, whose
    host work is on tensors too small for a parallel region, or with one torch thread."""
    return device.startswith("cuda") or num_threads == 1


class ComputeThread:
    def __init__(self, name: str, thread_setup: Callable[[], object] | None = None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._turn = threading.Lock()  # held by whichever thread runs a call, run's or run_here's
        # Called on each thread before the first call it runs (e.g. torch.get_num_threads,
        # which gives the thread torch's thread count for OpenMP).
        self.thread_setup = thread_setup
        self._set_up = threading.local()

    def run(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """Calls fn on the compute thread and waits; its exceptions re-raise here."""
        return self._pool.submit(self.run_here, fn, *args, **kwargs).result()

    def run_here(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """Calls fn on this thread, in turn with every other call. fn must not call ``run``
        (the compute thread would wait for the turn fn holds)."""
        with self._turn:
            if not getattr(self._set_up, "done", False):
                if self.thread_setup is not None:
                    self.thread_setup()
                self._set_up.done = True
            return fn(*args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
