"""Linear layers that run few-row steps on a prepacked copy of their weight.

A verify step runs a tree of ~16 tokens. At that size a linear layer streams its whole weight
for little arithmetic, and torch's kernel (MKL sgemm) re-packs the weight on every call, so on a
2-core CPU a 16-row forward of SmolLM2 cost almost twice a 1-row decode step. Packing each
weight once at load time cuts that; the project's own kernel (kernels/few_row_linear.cpp,
AVX-512 or AVX2) cuts it further by reading the weight ahead of the arithmetic, and MKL's packed
sgemm stands in where that kernel cannot be built. The figures: README, "On a small CPU". Steps of 1
to 3 rows (decode steps) take the kernel too: on a 2-core AMD EPYC torch's one-row GEMV ran
1.3-2.7x slower than the kernel (the LM head 10.5 ms against 3.9), and target-only decoding
through the stack went from 15.5-17.3 to 23.9-30.8 tok/s; on a 2-core Xeon a decode step with
the kernel (--exact's, docs/exact-mode.md) took 44 ms against 47 with torch's. Past 16 rows
(batched verifies and decodes, prefill chunks) a step takes the kernel in blocks of 16 for as
many rows as it was measured faster than torch's kernel on this CPU (kernel_rows.py). The copy
the kernel reads is the weight's quantized blocks where its values are a quantized
checkpoint's (quantized_pack.py: a fifth of the bytes, the same results bit for bit), else
fp32, or bf16 for drafters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from kernels import few_row_linear
from model_runtime import invariant, kernel_rows, quantized_pack

# The fewest rows that take the packed weight, by packer: with MKL's packed sgemm 1 to 3 rows
# measured slower than torch's kernel on the default model's shapes (2-core Xeon, torch 2.13
# CPU wheel); with the few-row kernel faster (the module's docstring).
MKL_MIN_ROWS = 4
KERNEL_MIN_ROWS = 1
PACKED_MAX_ROWS = few_row_linear.MAX_ROWS  # the most rows the kernel takes
PACK_HINT_ROWS = 16  # MKL's packing takes the expected row count as a layout hint

FewRowFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, packed) -> x @ weight.T


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state dict) with an optional prepacked weight."""

    packed: torch.Tensor | None = None
    few_row: FewRowFn | None = None
    min_rows: int = MKL_MIN_ROWS  # the fewest rows that take few_row (KERNEL_MIN_ROWS on it)
    # The most: past the kernel's 16 in blocks of 16, as far as it was measured faster than
    # torch's kernel on this CPU (model_runtime/kernel_rows.py).
    max_rows: int = PACKED_MAX_ROWS
    all_rows: bool = False  # every row count through few_row, 16 rows at a time (--exact)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        few_row = self.few_row
        if few_row is not None and x.dim() == 2 and self.bias is None:
            rows = x.shape[0]  # a decode's or a verify's rows: one kernel call, nothing around
            if rows <= PACKED_MAX_ROWS and (self.all_rows or rows >= self.min_rows):
                return few_row(x, self.packed)  # type: ignore[arg-type]
        if few_row is not None and x.dim() >= 2:
            rows = x.numel() // x.shape[-1]  # leading dims fold into rows ([B, k, H] in drafts)
            if self.all_rows or self.min_rows <= rows <= self.max_rows:
                out = self._on_packed(x.reshape(rows, x.shape[-1]))
                return out.view(*x.shape[:-1], out.shape[-1])
        return invariant.linear(x, self.weight, self.bias)

    def _on_packed(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel computes each row alone (same bits for 1 row or 16), so blocks of 16
        keep a row's result independent of how many rows share the step."""
        assert self.few_row is not None and self.packed is not None  # prepack_linears sets both
        out = kernel_rows.in_blocks(self.few_row, x, self.packed)
        return out if self.bias is None else out + self.bias


def can_prepack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    )


def prepack_linears(
    model: nn.Module,
    cache_dir: Path | None = None,
    use_kernel: bool = True,
    exact: bool = False,
    packed_dtype: torch.dtype = torch.float32,
    quantized: bool = True,
) -> tuple[int, str]:
    """Packs every Linear of a CPU fp32 model in place: (bytes of weight packed, packer name).

    The packed copies sit beside the weights (which the other row counts still use), so the
    model's weight memory roughly doubles (grows by half with bf16 copies). The packer names
    what each layer got: "few-row kernel", "MKL", or both with counts when some shapes fall
    back to MKL. ``quantized``: a weight whose values are a quantized checkpoint's (Q4_1 or
    Q8_0 blocks, model_runtime/quantized_pack.py) gets a copy in those blocks, with the fp32
    copy's results bit for bit. ``packed_dtype`` bfloat16 (drafters only: it changes the
    numerics) packs the other copies in bf16 and rounds those layers' own weights to the same
    values, so every row count computes with one set of weights.
    """
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    if not linears or not can_prepack(linears[0].weight):
        return 0, ""
    kernel = few_row_linear.load(cache_dir) if use_kernel else None
    if exact:
        _check_exact(linears, kernel, use_kernel, packed_dtype)
    packed_bytes, kinds = 0, Counter[str]()
    limits: RowLimits = {}
    with torch.no_grad():
        for module in linears:
            weight = module.weight.detach()
            if kernel is not None and few_row_linear.supports(weight):
                packed = _kernel_copy(kernel, weight, packed_dtype, quantized)
                _pack_on_kernel(module, kernel, packed, exact, limits, cache_dir)
                kinds[quantized_pack.kind(packed)] += 1
                packed_bytes += packed.numel() * packed.element_size()
            else:
                module.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_HINT_ROWS)
                module.few_row = _mkl_few_row(weight)
                packed_bytes += weight.numel() * weight.element_size()
    return packed_bytes, _packer_name(kinds, len(linears))


def _check_exact(
    linears: list[Linear], kernel: ModuleType | None, use_kernel: bool, packed_dtype: torch.dtype
) -> None:
    """--exact's numerics are the kernel's: every layer on it, in float32."""
    if kernel is None or not all(few_row_linear.supports(m.weight) for m in linears):
        reason = few_row_linear.unavailable_reason() or (
            "it is turned off (--no-few-row-kernel)" if not use_kernel
            else "it failed to build or a layer's shape does not fit it"
        )  # fmt: skip
        raise RuntimeError(f"--exact needs the few-row kernel for every linear layer: {reason}")
    if packed_dtype != torch.float32:
        raise ValueError("--exact keeps the target's weights in float32")


# By weight shape and copy kind: the layers of one shape and kind share one limit.
RowLimits = dict[tuple[int | str, ...], int]


def _kernel_copy(
    kernel: ModuleType, weight: torch.Tensor, packed_dtype: torch.dtype, quantized: bool
) -> torch.Tensor:
    """The kernel's copy of ``weight``: its quantized blocks where its values are some, else
    ``packed_dtype`` (bf16: the weight itself is rounded to the copy's values)."""
    found = quantized_pack.pack_quantized(kernel, weight) if quantized else None
    if found is not None:
        return found
    if packed_dtype != weight.dtype:
        weight.copy_(weight.to(packed_dtype))  # torch's row counts see the packed values
    return kernel.pack(weight.to(packed_dtype))


def _pack_on_kernel(
    module: Linear,
    kernel: ModuleType,
    packed: torch.Tensor,
    exact: bool,
    limits: RowLimits,
    cache_dir: Path | None,
) -> None:
    weight = module.weight.detach()
    module.packed, module.few_row = packed, kernel.linear
    module.min_rows, module.all_rows = KERNEL_MIN_ROWS, exact
    key = (*weight.shape, quantized_pack.kind(packed))
    if key not in limits and not exact:  # --exact takes every row count anyway
        limits[key] = kernel_rows.row_limit(kernel.linear, weight, packed, cache_dir)
    module.max_rows = limits.get(key, PACKED_MAX_ROWS)


def _packer_name(kinds: Counter[str], total: int) -> str:
    """"few-row kernel", with its copies' kinds where not all fp32 ("few-row kernel (q4_1
    copies)", "few-row kernel (copies: q4_1 x120, q8_0 x1)"), "MKL", or both with counts."""
    on_kernel = sum(kinds.values())
    if on_kernel == 0:
        return "MKL"
    name = "few-row kernel"
    if len(kinds) == 1 and "float32" not in kinds:
        name += f" ({next(iter(kinds))} copies)"
    elif len(kinds) > 1:
        name += " (copies: " + ", ".join(f"{k} x{n}" for k, n in kinds.most_common()) + ")"
    if on_kernel == total:
        return name
    return f"{name} for {on_kernel} layers, MKL for {total - on_kernel}"


def _mkl_few_row(weight: torch.Tensor) -> FewRowFn:
    """MKL's packed sgemm for this weight (it takes the unpacked weight too)."""
    return lambda x, packed: torch.ops.mkl._mkl_linear(x, packed, weight, None, x.shape[0])
