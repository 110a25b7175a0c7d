"""The target service's configuration: built once from the command line, never mutated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_runtime.config import DTYPES

# Decode graph batch buckets, up to the router's default running batch (64): a batch past the
# largest bucket decodes eagerly, which on the H200 ran batch 64 at a third of batch 32's
# tok/s (benchmarks/results/gpu_stack_2026-12-02d.json, switch phase, target-only).
DECODE_GRAPH_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# Up to the router's default --max-speculative-batch: a larger verify runs eagerly, which on
# the H200 took 11 ms of device time for 16 trees of 64 nodes (a 4-tree step: 1.45 ms).
VERIFY_GRAPH_BATCHES = (1, 2, 4, 8, 16, 32)

ATTENTION_BACKENDS = ("auto", "torch", "paged", "flashinfer")


@dataclass(frozen=True)
class TargetConfig:
    model_path: Path
    cache_dir: Path
    host: str = "127.0.0.1"
    port: int = 50061
    device: str = "cpu"
    dtype: str = "float32"
    num_slots: int = 32768  # KV pool size in tokens; the router assigns them
    max_requests: int = 256  # requests with live state (slot table rows) at once
    max_batch_tokens: int = 4096  # most tokens one Forward may carry
    max_context: int = 8192  # longest context, capped by the model's positions
    max_lookahead: int = 128  # slots a request may hold beyond its context (draft tree budget)
    max_tree_tokens: int = 64  # most nodes of one verified tree (advertised in TargetInfo)
    num_threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    prepack_weights: bool = True  # CPU fp32: prepacked weights for few-row (verify) steps
    few_row_kernel: bool = True  # pack for kernels/few_row_linear.cpp (else MKL's sgemm)
    quantized_copies: bool = True  # the kernel reads a quantized checkpoint's own blocks
    cuda_graphs: bool = True  # CUDA: decode steps replay captured graphs (graph_runner.py)
    fused_kernels: bool = True  # CUDA: RMSNorm, rotary, SiLU*mul as Triton kernels
    attention: str = "auto"  # "torch" (dense gather + SDPA), "paged" (Triton/C++ kernel), "auto",
    # or "flashinfer" (the paged metadata, FlashInfer's kernel; CUDA fp16/bf16, no graphs)
    exact: bool = False  # batch-invariant numerics (paged attention; few-row or invariant linears)
    graph_batch_sizes: tuple[int, ...] = DECODE_GRAPH_BATCHES
    verify_graphs: bool = False  # paged: greedy verify steps in fixed shapes (verify_graphs.py)
    verify_graph_batch_sizes: tuple[int, ...] = VERIFY_GRAPH_BATCHES
    max_decode_steps: int = 1  # most decode steps one Forward may run (multi_step.py)
    warm_up: bool = True  # a scratch request before serving (warm_up.py)

    @property
    def paged_metadata(self) -> bool:
        """Steps name their keys through the slot table (the paged and FlashInfer backends)."""
        return self.attention_backend in ("paged", "flashinfer")

    @property
    def attention_backend(self) -> str:
        """"auto" resolved: the paged Triton kernel on CUDA where triton imports (on the H200 it
        decoded 1.8x faster through the stack than torch's, benchmarks/results); on CPU the
        paged C++ kernel in float32 where it builds (AVX-512 or AVX2; on the default model's heads
        4-15x torch's gather and SDPA for a decode, 1.6-3.9x for a 17-node verify, docs/cpu.md),
        else torch. The engine checks the model's own dtype too (paged.load_cpu_kernel)."""
        if self.attention != "auto":
            return self.attention
        if self.device == "cpu":
            from kernels import few_row_linear

            can_build = few_row_linear.unavailable_reason() is None
            return "paged" if self.dtype == "float32" and can_build else "torch"
        from model_runtime.fused import triton_available

        return "paged" if triton_available() else "torch"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {sorted(DTYPES)}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention {self.attention!r}; choose one of {ATTENTION_BACKENDS}"
            )
        if self.attention == "flashinfer":
            from model_runtime.flashinfer_attention import unavailable_reason

            reason = unavailable_reason(self.device, self.dtype)
            if reason:
                raise ValueError(f"--attention flashinfer: {reason}")
        on_cpu = self.device == "cpu"
        if self.exact and on_cpu and self.dtype != "float32":
            raise ValueError(f"--exact on CPU is fp32 (the few-row kernel); got {self.dtype}")
        unpacked = on_cpu and not self.prepack_weights
        if self.exact and (self.attention_backend != "paged" or unpacked):
            raise ValueError("--exact needs the paged attention (and on CPU prepacked weights)")
        if self.max_tree_tokens <= 0:
            raise ValueError("max_tree_tokens must be positive")
        for name in (
            "num_slots", "max_requests", "max_batch_tokens", "max_context", "max_decode_steps"
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
