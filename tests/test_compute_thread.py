"""ComputeThread: every call runs on one thread, in turn; results and errors come back; calls
run on their callers' threads (run_here) still take turns with each other and with run's."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from plumbing.compute_thread import ComputeThread, may_run_inline


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


def test_calls_here_and_on_the_thread_never_overlap() -> None:
    compute = ComputeThread("test-compute")
    running = threading.Semaphore(1)
    here: list[int] = []

    def work(i: int) -> int:
        assert running.acquire(blocking=False), "two calls ran at once"
        try:
            if i % 2:
                here.append(threading.get_ident())
            return i + 1
        finally:
            running.release()

    def call(i: int) -> int:
        return compute.run_here(work, i) if i % 2 else compute.run(work, i)

    try:
        compute_thread = compute.run(threading.get_ident)
        with ThreadPoolExecutor(max_workers=8) as callers:
            results = list(callers.map(call, range(200)))
    finally:
        compute.close()
    assert results == [i + 1 for i in range(200)]
    assert here and compute_thread not in here  # run_here ran on the callers' threads


def test_inline_only_where_no_openmp_team_can_form() -> None:
    assert may_run_inline("cuda", 16)
    assert may_run_inline("cuda:1", 16)
    assert may_run_inline("cpu", 1)
    assert not may_run_inline("cpu", 2)


def test_each_thread_is_set_up_once_before_its_first_call() -> None:
    set_up: list[int] = []
    compute = ComputeThread(
        "test-compute", thread_setup=lambda: set_up.append(threading.get_ident())
    )

    def call(_: int) -> None:
        for _ in range(5):
            compute.run_here(lambda: None)
        compute.run(lambda: None)

    try:
        with ThreadPoolExecutor(max_workers=4) as callers:
            list(callers.map(call, range(8)))
    finally:
        compute.close()
    assert len(set_up) == len(set(set_up))  # once a thread
    assert len(set_up) >= 2  # a caller's thread and the compute thread at least
