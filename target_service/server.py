"""Runs the target model service: `python -m target_service` or `splitspec target`."""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
import torch

from model_runtime.cuda_setup import prefer_efficient_attention
from model_runtime.fused import use_fused_kernels
from model_runtime.fused_layers import merge_projections
from model_runtime.invariant import use_invariant_matmul
from model_runtime.llama import LlamaForCausalLM
from model_runtime.loading import load_model
from model_runtime.packed_linear import prepack_linears
from model_runtime.service_main import run_service
from plumbing.compute_thread import ComputeThread
from plumbing.drain import drain_on_sigterm, grace_s
from plumbing.grpc_util import SERVER_OPTIONS, start_server
from plumbing.rpc_stream import StreamGate
from plumbing.security import ServerTLS
from protos import target_pb2, target_pb2_grpc
from target_service.arguments import add_arguments, config_from_args
from target_service.config import TargetConfig
from target_service.engine import TargetEngine
from target_service.graph_runner import DecodeGraphRunner
from target_service.servicer import TargetServicer
from target_service.verify_graphs import VerifyGraphRunner, tree_buckets_up_to
from target_service.warm_up import warm_up

log = logging.getLogger("splitspec.target")
SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetModel"].full_name
GRPC_WORKERS = 8


def build_engine(config: TargetConfig) -> TargetEngine:
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    dtype = getattr(torch, config.dtype)
    model = load_model(config.model_path, dtype, torch.device(config.device), config.cache_dir)
    if config.prepack_weights:
        packed, packer = prepack_linears(
            model, config.cache_dir, config.few_row_kernel, config.exact,
            quantized=config.quantized_copies,
        )  # fmt: skip
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
        attach_graphs(engine, model)
    if config.warm_up:
        warm_up(engine)
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


def attach_graphs(engine: TargetEngine, model: LlamaForCausalLM) -> None:
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
                                   batch_buckets=config.verify_graph_batch_sizes,
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
        masked_verify_graph_batch=(
            engine.verify_graphs.masked_graph_batch() if engine.verify_graphs else 0
        ),
    )


def serve(config: TargetConfig, tls: ServerTLS | None = None) -> None:
    compute = ComputeThread("target-compute")
    engine = compute.run(build_engine, config)  # the model loads on the thread that runs it
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS), options=SERVER_OPTIONS
    )
    # An open stream holds a worker: half of them stay for unary calls and health checks.
    streams = StreamGate(max_open=GRPC_WORKERS // 2)
    target_pb2_grpc.add_TargetModelServicer_to_server(
        TargetServicer(engine, target_info(engine), compute, streams), server
    )
    address = f"{config.host}:{config.port}"
    health, address = start_server(server, [SERVICE_NAME], address, "target", tls)
    drain_on_sigterm(server, health, grace_s(5.0), streams)
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
    run_service("target", __doc__, add_arguments, config_from_args, serve, argv)
