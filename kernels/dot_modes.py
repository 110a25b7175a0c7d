"""How a Triton kernel's tl.dot runs, chosen per input dtype (the DOT constexpr): bf16/fp16 on
the tensor cores with fp32 accumulation, fp32 as IEEE fp32 products (an fp32 model stays fp32),
and under Triton's interpreter, whose bf16 dot is wrong, 16-bit operands widened to fp32 first
(their products are exact in fp32, as on the tensor cores)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

NATIVE, IEEE, WIDENED = 0, 1, 2


@triton.jit
def dot(a, b, DOT: tl.constexpr):
    if DOT == 0:
        return tl.dot(a, b)
    elif DOT == 1:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


def dot_mode(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return IEEE
    return WIDENED if os.environ.get("TRITON_INTERPRET") == "1" else NATIVE
