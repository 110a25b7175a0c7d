"""Llama building blocks, numerically matched to transformers' reference implementation."""

from __future__ import annotations

import torch
from torch import nn

from model_runtime import fused
from model_runtime.packed_linear import Linear


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps)


class GatedMLP(nn.Module):
    gate_up_weight: torch.Tensor  # gate|up in one weight: set by fused_layers.merge_projections

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused.silu_mul(self.gate_proj(x), self.up_proj(x)))


class RotaryTable(nn.Module):
    """cos/sin for every position up to max_position, computed once in fp32.

    A step gathers its rows from one [positions, 2, head_dim] copy in the step's dtype, made on
    first use: one gather kernel instead of two gathers and two casts, which on the GPU are
    ~2 us each of a graph-replayed decode step. Casting the table first gives the same values as
    casting the gathered rows.
    """

    cos: torch.Tensor  # [max_position, head_dim] fp32 buffers (register_buffer below)
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_position: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self._stacked: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns cos, sin of shape [T, 1, head_dim] in ``dtype`` (views of one gather)."""
        rows = self._table(dtype)[positions]  # [T, 2, head_dim]
        return rows[:, :1], rows[:, 1:]

    def _table(self, dtype: torch.dtype) -> torch.Tensor:
        key = (dtype, self.cos.device)  # .to(device) moves the buffers: a new copy follows them
        table = self._stacked.get(key)
        if table is None:
            # A plain tensor even when first asked inside inference_mode (training reads it too).
            with torch.inference_mode(False), torch.no_grad():
                table = torch.stack([self.cos, self.sin], dim=1).to(dtype)
            self._stacked = {key: table}
        return table


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [..., heads, head_dim]; cos, sin broadcast over heads."""
    return fused.rotary(x, cos, sin)
