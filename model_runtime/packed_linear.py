"""Linear layers that can run few-row steps on an MKL-prepacked copy of their weight.

A verify step runs a tree of ~16 tokens. At that size MKL's sgemm re-packs the whole weight
matrix on every call (and below 16 rows it takes a path that is slower still for the LM head's
49k outputs), so on a 2-core CPU a 16-row forward of SmolLM2 cost almost twice a 1-row decode
step. Packing each weight once at load time cuts that (the figures are in the README). One-row
decode steps are GEMVs that packing does not help, and long prefills run faster unpacked, so
both keep torch's own kernel; their numerics do not change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Row counts that take the packed weight: measured faster than torch's kernel on the default
# model's shapes (2-core Xeon, torch 2.13 CPU wheel); outside it the packed path was slower.
PACKED_MIN_ROWS = 4
PACKED_MAX_ROWS = 16
PACK_HINT_ROWS = 16  # MKL's packing takes the expected row count as a layout hint


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) with an optional prepacked weight."""

    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None and x.dim() == 2:
            rows = x.shape[0]
            if PACKED_MIN_ROWS <= rows <= PACKED_MAX_ROWS:
                return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, rows)
        return F.linear(x, self.weight, self.bias)


def can_prepack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    )


def prepack_linears(model: nn.Module) -> int:
    """Packs every Linear of a CPU fp32 model in place; returns the bytes of weight packed.

    The packed copies sit beside the weights (which the other row counts still use), so the
    model's weight memory roughly doubles.
    """
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if not linears or not can_prepack(linears[0].weight):
        return 0
    packed_bytes = 0
    with torch.no_grad():
        for module in linears:
            weight = module.weight.detach()
            module.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_HINT_ROWS)
            packed_bytes += weight.numel() * weight.element_size()
    return packed_bytes
