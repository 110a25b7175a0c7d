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
"""

from __future__ import annotations

import os
import sys

SPINS = {"target": 200_000, "draft": 100_000}


def shorten_idle_spin(service: str) -> None:
    """Sets ``service``'s spin count in the environment, if torch is not loaded yet (libgomp
    would not read it again) and the user did not choose one."""
    if "torch" in sys.modules or "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["GOMP_SPINCOUNT"] = str(SPINS[service])
