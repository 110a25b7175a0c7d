"""The draft replicas' deadlines and circuit breaker, and merging the updates a skipped
replica missed (no processes: the pieces alone)."""

from __future__ import annotations

import struct

import pytest

from protos import draft_pb2, tensor_pb2
from router import replica_health
from router.replica_health import CLOSED, OPEN, SUSPECT, DeadlinePolicy, ReplicaHealth
from router.skipped_rounds import concat_rows, merge_updates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(replica_health.time, "monotonic", c)
    return c


def test_deadline_follows_the_recent_p99(clock: Clock) -> None:
    h = ReplicaHealth(DeadlinePolicy(multiple=2.0, floor_s=0.005, cap_s=10.0, initial_s=2.0))
    assert h.deadline_s("propose") == 2.0  # nothing measured yet
    for _ in range(20):
        h.record("propose", 0.010)
    h.record("propose", 0.050)
    assert h.deadline_s("propose") == pytest.approx(0.100)  # 2 x the p99 (the slow one)
    clock.now += 6.0  # the slow call ages out of the horizon...
    for _ in range(10):
        h.record("propose", 0.010)
    assert h.deadline_s("propose") == pytest.approx(0.020)  # ...and the deadline shrinks
    for _ in range(64):
        h.record("propose", 0.0001)
    assert h.deadline_s("propose") == 0.005  # the floor
    for _ in range(64):
        h.record("propose", 100.0)
    assert h.deadline_s("propose") == 10.0  # the cap


def test_ingest_deadline_scales_with_its_tokens(clock: Clock) -> None:
    h = ReplicaHealth(DeadlinePolicy(multiple=2.0, floor_s=0.001))
    for _ in range(10):
        h.record("ingest", 0.100, units=100)  # 1 ms a token
    assert h.deadline_s("ingest", 500) == pytest.approx(1.0)


def test_breaker_suspects_then_ejects_with_growing_backoff(clock: Clock) -> None:
    h = ReplicaHealth(eject_after_s=8.0, backoff_s=0.5, max_backoff_s=4.0)
    h.missed()
    assert h.state == SUSPECT and not h.callable and h.wants_probe()
    clock.now += 1.0
    assert h.probe_failed() is False and h.state == SUSPECT  # not long enough yet
    clock.now += 7.5
    assert h.probe_failed() is True and h.state == OPEN  # suspected for 8.5 s: ejected
    assert not h.wants_probe()
    clock.now += 0.5
    assert h.wants_probe()
    h.probe_failed()  # still down: the next backoff is doubled
    clock.now += 0.9
    assert not h.wants_probe()
    clock.now += 0.2
    assert h.wants_probe()
    for _ in range(10):
        h.probe_failed()
    assert h.retry_at - clock.now == pytest.approx(4.0)  # capped
    h.probe_passed()
    assert h.state == CLOSED and h.callable
    assert (h.misses, h.num_ejections) == (1, 12)


def test_a_good_probe_clears_a_suspect(clock: Clock) -> None:
    h = ReplicaHealth()
    h.missed()
    h.probe_passed()
    assert h.state == CLOSED and h.failures == 0


def _rows(values: list[float], width: int) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor(data=struct.pack(f"<{len(values)}f", *values), dtype="float32",
                             shape=[len(values) // width, width])


def test_merged_updates_carry_every_token_and_hidden_row() -> None:
    old = draft_pb2.ContextUpdate(request_id="r", start_pos=10, token_ids=[1, 2],
                                  hidden_start_pos=9)
    old.hidden.CopyFrom(_rows([1, 2, 3, 4], 2))
    new = draft_pb2.ContextUpdate(request_id="r", start_pos=12, token_ids=[3],
                                  hidden_start_pos=11)
    new.hidden.CopyFrom(_rows([5, 6], 2))
    merged = merge_updates(old, new)
    assert (merged.start_pos, list(merged.token_ids), merged.hidden_start_pos) == (10, [1, 2, 3], 9)
    assert list(merged.hidden.shape) == [3, 2]
    assert struct.unpack("<6f", merged.hidden.data) == (1, 2, 3, 4, 5, 6)
    with pytest.raises(ValueError, match="line up"):
        merge_updates(new, old)
    with pytest.raises(ValueError, match="stack"):
        concat_rows(_rows([1, 2], 2), _rows([1, 2, 3], 3))


def test_short_ingests_do_not_stretch_a_long_ones_deadline(clock: Clock) -> None:
    # 20 ms an Ingest of 1-8 tokens is round-trip time, not 20 ms a token: a 80-token Ingest's
    # deadline stays near a round's (the step waits for it), not 80 x 2 x 20 ms.
    h = ReplicaHealth(DeadlinePolicy(multiple=2.0, floor_s=0.001, min_units=64))
    for units in range(1, 9):
        h.record("ingest", 0.020, units=units)
    assert h.deadline_s("ingest", 8) == pytest.approx(0.040)
    assert h.deadline_s("ingest", 80) == pytest.approx(0.050)


def test_p99_refreshes_after_a_few_samples_or_a_short_while(clock: Clock) -> None:
    window = replica_health.LatencyWindow(64)
    for _ in range(8):
        window.add(0.010)
    assert window.p99() == pytest.approx(0.010)
    window.add(0.500)  # one slow call: the cached figure holds for a few more samples...
    assert window.p99() == pytest.approx(0.010)
    clock.now += 2 * replica_health.P99_REFRESH_S  # ...or a short while
    assert window.p99() == pytest.approx(0.500)
    for _ in range(replica_health.P99_REFRESH_ADDS):
        window.add(0.020)
    assert window.p99() == pytest.approx(0.500)  # recomputed: the slow one is still the p99
    clock.now += 10.0  # every sample out of the horizon: the last min_samples count
    assert window.p99() == pytest.approx(0.020)
