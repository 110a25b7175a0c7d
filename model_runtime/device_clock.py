"""The device's own time on a service call: CUDA events around the call's graph replays (and
eager forwards), read after the call's one device->host sync, so timing adds no sync.

A service reports it beside its wall-clock work (``device_ms`` in Forward, Verify and Propose
replies): what a round spends beyond it is host work, RPCs and the router. On a CPU there is
no separate device and the clock reads 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class DeviceClock:
    def __init__(self, device: torch.device) -> None:
        self.enabled = device.type == "cuda"
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def region(self) -> Iterator[None]:
        """Times the device work launched inside the block (not the host's time)."""
        if not self.enabled:
            yield
            return
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self._spans.append((start, end))

    def take_ms(self) -> float:
        """The regions' device time since the last take; call after the call's sync (the
        events are complete by then, so this waits for nothing)."""
        spans, self._spans = self._spans, []
        if spans:
            spans[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in spans)
