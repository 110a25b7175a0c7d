"""Zero-filled pools whose memory a CPU pays for as it is used, not at start-up.

``torch.zeros`` writes every byte of a pool before the service can serve: on the 2-core dev box
the target's default KV and hidden-state pools (32768 slots, 1.5 GB in float32) took 4-10 s
that way, the slowest step of its start, and 17 s beside a draft replica's start. An anonymous
private mapping is zero by definition (the kernel hands out a zeroed page at its first touch),
so the same zeros cost nothing up front; a request's first use of a page costs one page fault
(about 7 us there, so about 0.07 ms a token across the 60 KV pools), and pages never touched
are never resident. On CUDA ``torch.zeros`` is a single fast kernel, so it stays.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``, backed by lazily zeroed pages on a
    CPU."""
    count, device = math.prod(shape), torch.device(device)
    if device.type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, count * dtype.itemsize, flags=mmap.MAP_PRIVATE)
    # The tensor holds the mapping: it is unmapped when the last view of it goes.
    return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)
