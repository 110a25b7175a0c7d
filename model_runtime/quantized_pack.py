"""Quantized copies of fp32 weights for the few-row kernel, found in the weights' own values.

The default model is a GGUF file whose layers are Q4_1 blocks and whose embedding (the tied LM
head) is Q8_0 blocks; the loader dequantizes them to fp32 (model_runtime/loading.py). A few-row
step is bound by the bytes of weight it streams, 32 bits a weight in fp32. So where every
block of 32 values along a row rebuilds bit for bit from a Q4_1 block (fp16 d and m, 4-bit q:
d * q + m) or a Q8_0 block (fp16 d, 8-bit q: d * q), the kernel reads those blocks instead,
5 or 8.5 bits a weight, and rebuilds each weight in a register exactly as the loader did
(kernels/quantized_weights.h). The products are the fp32 copy's, bit for bit: the output does
not change. A weight with any block that does not rebuild (a float checkpoint, a trained
head) keeps its fp32 or bf16 copy.

The blocks are found from the values (kernels/quantized_search.h), not read from the file, so
row permutations and fused projections made at load time do not matter: they move whole rows,
and a row's blocks of 32 stay together.
"""

from __future__ import annotations

from types import ModuleType

import torch

GROUP = 32  # values a block (GGUF's QK4_1 and QK8_0); quantized_weights.h's GROUP
COLUMNS = 16  # output columns a packed block: the kernel's BLOCK
Q4_1_BYTES = 2 * 2 * COLUMNS + COLUMNS * GROUP // 2  # d, m (fp16) and 4-bit q of 16 columns
Q8_0_BYTES = 2 * COLUMNS + COLUMNS * GROUP  # d (fp16) and 8-bit q of 16 columns
KINDS = {Q4_1_BYTES: "q4_1", Q8_0_BYTES: "q8_0"}


def pack_quantized(kernel: ModuleType, weight: torch.Tensor) -> torch.Tensor | None:
    """The kernel's Q4_1 or Q8_0 copy of an fp32 ``weight`` [N, K] whose every value it
    rebuilds exactly (the smaller first), else None."""
    for bits in (4, 8):
        packed = kernel.pack_quantized(weight, bits)
        if packed.numel():
            return packed
    return None


def kind(packed: torch.Tensor) -> str:
    """What a kernel copy holds: float32, bfloat16, q4_1 or q8_0."""
    if packed.dtype != torch.uint8:
        return str(packed.dtype).removeprefix("torch.")
    return KINDS[packed.shape[-1]]


def dequantize(packed: torch.Tensor) -> torch.Tensor:
    """The fp32 weight [N, K] a quantized copy holds, in plain torch (the tests' reference for
    what the kernel rebuilds)."""
    blocks, groups, size = packed.shape
    scales = packed[..., : 2 * COLUMNS].contiguous().view(torch.float16).float()  # [B, G, 16]
    if size == Q4_1_BYTES:
        m = packed[..., 2 * COLUMNS : 4 * COLUMNS].contiguous().view(torch.float16).float()
        lines = packed[..., 4 * COLUMNS :].reshape(blocks, groups, GROUP // 2, COLUMNS)
        q = torch.stack([lines & 0x0F, lines >> 4], dim=3).reshape(blocks, groups, GROUP, COLUMNS)
        values = scales[:, :, None] * q.float() + m[:, :, None]
    else:
        q = packed[..., 2 * COLUMNS :].contiguous().view(torch.int8)
        values = scales[:, :, None] * q.reshape(blocks, groups, GROUP, COLUMNS).float()
    # [B, G, 32 (k), 16 (column)] -> [N, K]
    return values.permute(0, 3, 1, 2).reshape(blocks * COLUMNS, groups * GROUP)
