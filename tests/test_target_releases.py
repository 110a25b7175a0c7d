"""The releases that failed go again, but never under an id that is in flight again."""

from __future__ import annotations

import asyncio
import time

import grpc

from router import target_releases
from router.target_releases import TargetReleases


class FlakyTarget:
    """Answers Release as the target does, after failing the first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.released: list[list[str]] = []

    async def release(self, request_ids: list[str]) -> None:
        if self.failures:
            self.failures -= 1
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty, "reset")
        self.released.append(request_ids)


def test_a_failed_release_goes_with_the_next_flush() -> None:
    target = FlakyTarget(failures=1)
    releases = TargetReleases(target, in_flight={})  # type: ignore[arg-type]
    asyncio.run(releases.release(["a", "b"]))
    assert releases.pending == {"a", "b"}
    asyncio.run(releases.flush())  # too soon after the failure: not tried
    assert target.released == [] and releases.pending == {"a", "b"}
    time.sleep(target_releases.RETRY_AFTER_S)
    asyncio.run(releases.flush())
    asyncio.run(releases.flush())  # nothing left: no call
    assert target.released == [["a", "b"]] and not releases.pending


def test_an_id_in_flight_again_is_not_released() -> None:
    """A client reusing "b" (or "b" retracted back into the queue): its first item opens it
    afresh on the target, and releasing it now would drop the new request's state."""
    target = FlakyTarget(failures=1)
    in_flight: dict[str, object] = {}
    releases = TargetReleases(target, in_flight)  # type: ignore[arg-type]
    asyncio.run(releases.release(["a", "b"]))
    in_flight["b"] = object()
    asyncio.run(releases.release(["c"]))
    assert target.released == [["c", "a"]] and not releases.pending


def test_pending_releases_are_forgotten_once_the_target_was_swept() -> None:
    target = FlakyTarget(failures=1)
    releases = TargetReleases(target, in_flight={})  # type: ignore[arg-type]
    asyncio.run(releases.release(["a"]))
    releases.forget()  # the target back after a loss, everything it held released
    time.sleep(target_releases.RETRY_AFTER_S)
    asyncio.run(releases.flush())
    assert target.released == [] and not releases.pending
