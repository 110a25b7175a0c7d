"""A step's small inputs in one host->device copy: a host buffer (pinned on CUDA) and the device
buffer a graph reads, with named views of both.

On the H200 box every eager launch or pageable copy costs tens of microseconds, so a graph
runner fills the host views (through numpy for integers), then copies the whole buffer in one
non-blocking transfer ahead of its replay on the same stream. Reuse is guarded: the host buffer
is refilled only once the previous copy out of it has completed.
"""

from __future__ import annotations

import math

import torch


class Staging:
    def __init__(
        self, fields: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device
    ) -> None:
        """``fields``: name -> shape; each is a view of one flat buffer, in this order."""
        total = sum(math.prod(shape) for shape in fields.values())
        pinned = device.type == "cuda"
        self.host = torch.zeros(total, dtype=dtype, pin_memory=pinned)
        self.device = torch.zeros(total, dtype=dtype, device=device)
        self._host_views: dict[str, torch.Tensor] = {}
        self.views: dict[str, torch.Tensor] = {}  # the device views: what a graph reads
        start = 0
        for name, shape in fields.items():
            size = math.prod(shape)
            self._host_views[name] = self.host[start : start + size].view(shape)
            self.views[name] = self.device[start : start + size].view(shape)
            start += size
        self._copied = torch.cuda.Event() if pinned else None

    def fill(self) -> dict[str, torch.Tensor]:
        """The host views to fill (integer fields fill fastest through ``.numpy()``), once
        the last copy out of them has completed."""
        if self._copied is not None:
            self._copied.synchronize()
        return self._host_views

    def upload(self, count: int | None = None) -> None:
        """The buffer's first ``count`` elements (all by default) to the device, in stream
        order before what is launched next. A prefix is enough where the first field's
        leading rows are all a step fills (a batch smaller than the largest bucket)."""
        end = self.host.numel() if count is None else count
        self.device[:end].copy_(self.host[:end], non_blocking=self._copied is not None)
        if self._copied is not None:
            self._copied.record()
