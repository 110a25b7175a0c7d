"""ComputeThread: every call runs on one thread, in turn; results and errors come back."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from splitspec.compute_thread import ComputeThread


def test_calls_from_many_threads_all_run_on_one_thread_one_at_a_time() -> None:
    compute = ComputeThread("test-compute")
    seen: list[int] = []
    running = threading.Semaphore(1)  # a second call inside the first would fail to take it

    def work(i: int) -> int:
        assert running.acquire(blocking=False), "two calls ran at once"
        try:
            seen.append(threading.get_ident())
            return i * i
        finally:
            running.release()

    try:
        with ThreadPoolExecutor(max_workers=8) as callers:
            results = list(callers.map(lambda i: compute.run(work, i), range(64)))
    finally:
        compute.close()
    assert results == [i * i for i in range(64)]
    assert len(set(seen)) == 1
    assert seen[0] != threading.get_ident()


def test_an_error_re_raises_in_the_caller_and_the_thread_keeps_serving() -> None:
    compute = ComputeThread("test-compute")

    def fail(message: str) -> None:
        raise KeyError(message)

    try:
        with pytest.raises(KeyError, match="no such request"):
            compute.run(fail, "no such request")
        assert compute.run(lambda a, b=0: a + b, 2, b=3) == 5
    finally:
        compute.close()
