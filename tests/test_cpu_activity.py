"""What the idle spinners read (plumbing/cpu_activity.py): a process tree's CPU ticks from
/proc, without the spinners' own subtree, and the busy/idle verdict with its quiet spell. The
process table here is a folder of stat files laid out as /proc lays them out."""

from __future__ import annotations

from pathlib import Path

from plumbing.cpu_activity import ActivityWatch, TreeTicks, descendants, read_stat


def write_stat(proc: Path, pid: int, parent: int, user: int, system: int = 0) -> None:
    # Fields after the name: state, ppid, then 9 more before utime (14th) and stime (15th).
    fields = ["S", parent, *[0] * 9, user, system, 0, 0, 20, 0]
    (proc / str(pid)).mkdir(exist_ok=True)
    (proc / str(pid) / "stat").write_text(
        f"{pid} (a name) with spaces) " + " ".join(map(str, fields))
    )


def test_a_stat_line_gives_the_parent_and_user_plus_system_ticks(tmp_path: Path) -> None:
    write_stat(tmp_path, 7, parent=3, user=40, system=2)
    assert read_stat(7, tmp_path) == (3, 42)
    assert read_stat(8, tmp_path) is None  # gone


def test_the_tree_leaves_out_the_spinners_subtree(tmp_path: Path) -> None:
    for pid, parent in [(10, 1), (11, 10), (12, 11), (20, 10), (21, 20), (30, 1)]:
        write_stat(tmp_path, pid, parent, user=0)
    assert descendants(10, leave_out=20, proc=tmp_path) == {10, 11, 12}
    assert descendants(10, leave_out=99, proc=tmp_path) == {10, 11, 12, 20, 21}


def test_ticks_count_from_a_process_first_sight_and_rescans_find_new_ones(tmp_path: Path) -> None:
    write_stat(tmp_path, 10, 1, user=500)  # a service that has run a while
    ticks = TreeTicks(root=10, leave_out=20, rescan_s=2.0, proc=tmp_path)
    assert ticks.spent_since_last(0.0) == 0  # its past is not activity
    write_stat(tmp_path, 10, 1, user=503)
    write_stat(tmp_path, 11, 10, user=50)  # a child started meanwhile: not scanned yet
    write_stat(tmp_path, 20, 10, user=900)  # the spinners: never counted
    assert ticks.spent_since_last(1.0) == 3
    write_stat(tmp_path, 11, 10, user=54)
    write_stat(tmp_path, 20, 10, user=990)
    assert ticks.spent_since_last(2.0) == 0  # rescanned: the child counts from here
    write_stat(tmp_path, 10, 1, user=504)
    write_stat(tmp_path, 11, 10, user=60)
    assert ticks.spent_since_last(2.1) == 1 + 6


class Ticks:
    """Ticks a test hands out poll by poll (the watch's input, not what is tested)."""

    def __init__(self, spent: list[int]) -> None:
        self.spent = spent

    def spent_since_last(self, now: float) -> int:
        return self.spent.pop(0)


def test_busy_from_a_poll_with_enough_ticks_until_a_quiet_spell_passes() -> None:
    spent = Ticks([5, 1, 1, 0, 2, 0])
    watch = ActivityWatch(spent, idle_after_s=1.0, min_ticks=2, now=0.0)  # type: ignore[arg-type]
    assert watch.busy(10.0)  # 5 ticks
    assert watch.busy(10.5)  # 1 tick: not busy by itself, but within the spell
    assert watch.busy(10.9)
    assert not watch.busy(11.0)  # a second after the last busy poll
    assert watch.busy(12.0)  # 2 ticks: busy again
    assert not watch.busy(13.5)


def test_a_new_watch_counts_as_busy_through_its_first_quiet_spell() -> None:
    watch = ActivityWatch(Ticks([0, 0]), idle_after_s=60.0, now=0.0)  # type: ignore[arg-type]
    assert watch.busy(1.0)
    assert not watch.busy(61.0)
