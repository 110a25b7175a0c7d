"""Counting a call's host-side torch work by phase, for benchmarks/host_ops.py (whose docstring
says what each count means): torch calls, ATen ops, and copies that cross to or from the device
on CUDA, told apart on the CPU by which storages would live in device memory there."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

READS = ("tolist", "item", "numpy", "__int__", "__float__", "__bool__", "__index__")


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class HostOps(TorchFunctionMode):
    """Counts torch calls, ATen ops and device crossings by phase (see benchmarks/host_ops.py)."""

    def __init__(self, device_tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.device_storages = {storage_of(t) for t in device_tensors}
        self.phase = "verify"
        self.counts: Counter[str] = Counter()
        self.kept: list[torch.Tensor] = []
        self.by_name: dict[str, Counter[str]] = {"admission": Counter(), "verify": Counter()}

    @contextlib.contextmanager
    def within(self, phase: str) -> Iterator[None]:
        outer, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = outer

    def on_device(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and storage_of(value) in self.device_storages

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if self.phase == "body" or name == "__get__":
            return out
        self.counts[f"{self.phase}.torch_calls"] += 1
        self.by_name[self.phase][name] += 1
        crossing = self.crossing(name, args, kwargs)
        if crossing:
            self.counts[f"{self.phase}.{crossing}"] += 1
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        lands_on_device = crossing == "h2d" or (
            crossing is None and any(map(self.on_device, tensors))
        )
        if lands_on_device and isinstance(out, torch.Tensor):
            self.device_storages.add(storage_of(out))
            self.kept.append(out)  # alive to the end, so no host tensor reuses its address
        return out

    def crossing(self, name: str, args: tuple, kwargs: dict) -> str | None:
        if name == "copy_":
            dst, src = self.on_device(args[0]), self.on_device(args[1])
            return {(True, False): "h2d", (False, True): "d2h"}.get((dst, src))
        if name in ("to", "cpu", "cuda"):
            moving = (
                name != "to"
                or "device" in kwargs
                or any(isinstance(a, str | torch.device) for a in args[1:])
            )
            return None if not moving else ("d2h" if self.on_device(args[0]) else "h2d")
        if name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            return "h2d"
        if name in READS and self.on_device(args[0]):
            return "d2h"
        return None


class AtenOps(TorchDispatchMode):
    def __init__(self, phases: HostOps) -> None:
        super().__init__()
        self.phases = phases

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.phases.counts[f"{self.phases.phase}.aten_ops"] += 1
        return func(*args, **(kwargs or {}))


def phased(phases: HostOps, phase: str, func: Callable) -> Callable:
    def wrapped(*args, **kwargs):
        with phases.within(phase):
            return func(*args, **kwargs)

    return wrapped
