"""One thread for all of a service's model work: loading, steps, reads.

torch's CPU kernels run on OpenMP, which keeps a team of worker threads per calling thread.
When each gRPC handler thread runs model code, a process gathers several teams; once their
threads outnumber the cores, libgomp stops spinning between parallel regions and every region
pays a futex wake-up. On a 2-core CPU that turned a 43 ms decode step of the default model
into 70 ms. Running every model call on this one thread keeps a single team, and serializes
the calls, which the engines need anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, fn: Callable[..., T], /, *args, **kwargs) -> T:
        """Calls fn on the compute thread and waits; its exceptions re-raise here."""
        return self._pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
