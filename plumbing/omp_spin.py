"""How long a model service's idle OpenMP workers keep a core, set before torch loads libgomp.

torch's CPU kernels run on libgomp, which reads GOMP_SPINCOUNT once, when it loads: after each
parallel region a worker spins that many times on a pause instruction before it sleeps. Its
default, 300,000 spins, is 7.5 ms on the 2-core AMD EPYC dev box (25 ns a pause), longer than
the gap between a target's decode steps (~1.6 ms of RPC and router), which pays there: the
workers are awake for the next step. But at batch 1 with speculation on one machine the target
and a CPU drafter take turns, and for 7.5 ms after each turn the finished service's spinning
worker holds a core that the other one's call needs.

So each service sets a shorter spin of its own unless the user set one (GOMP_SPINCOUNT, or
OMP_WAIT_POLICY, which sets libgomp's default): the target takes 200,000 (5 ms, still longer
than its gap between steps), the drafter 100,000 (2.5 ms; its steps come back to back within a
round). Two stacks side by side on that box, requests alternating between them
(benchmarks/twin_stacks.py, 2026-12-06): EAGLE 1.12x libgomp's default's tok/s, target-only
1.01x. Both services at 100,000 lost target-only 3-6%, at 20,000 12%: a worker that falls asleep
between a step's own parallel regions must be woken for each.

Where the service chose the spin, the target also ends its idle workers at once after a Verify
on CPU (release_idle_workers): at batch 1 the drafter's round comes next, and the target's
workers would spin through its first 5 ms. Twin stacks in both orders, 2026-12-06: this against
the code before it, EAGLE 1.08x and target-only 1.01x (the drafter's release after its Propose
as well: 1.08x and 0.98x; the drafter's alone: 1.01x and 1.00x, so it is not kept;
benchmarks/results/cpu_omp_release_2026-12-06.json).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

SPINS = {"target": 200_000, "draft": 100_000}


def shorten_idle_spin(service: str) -> None:
    """Sets ``service``'s spin count in the environment, if torch is not loaded yet (libgomp
    would not read it again) and the user did not choose one."""
    global _spin_is_ours
    if "torch" in sys.modules or "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["GOMP_SPINCOUNT"] = str(SPINS[service])
    _spin_is_ours = True


_spin_is_ours = False  # shorten_idle_spin set the spin: the user left the workers to us
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t's omp_pause_soft (OpenMP 5.0)


def release_idle_workers() -> None:
    """Ends the calling thread's idle OpenMP workers now instead of after their spin (libgomp's
    omp_pause_resource_all); its next parallel region starts new ones, about 40 us on the dev
    box. Nothing happens where the user chose the spin or where torch's libgomp lacks the call.
    """
    pause = _omp_pause() if _spin_is_ours else None
    if pause is not None:
        pause(OMP_PAUSE_SOFT)


@functools.cache
def _omp_pause() -> Callable[[int], int] | None:
    import torch  # only the model services call this; the router never does

    library = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if not library.is_file():
        return None
    return getattr(ctypes.CDLL(str(library)), "omp_pause_resource_all", None)
