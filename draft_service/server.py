"""Runs a draft replica: `python -m draft_service --method ngram|eagle|scripted|recording`.

"scripted" and "recording" are test-only drafters (see draft_service/test_drafters.py).
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
import torch

from draft_service.arguments import DraftConfig, add_arguments, config_from_args
from draft_service.drafter import Drafter
from draft_service.ngram_drafter import NgramContextDrafter
from draft_service.servicer import DraftEngine, DraftServicer
from model_runtime.service_main import run_service
from plumbing.compute_thread import ComputeThread
from plumbing.drain import drain_on_sigterm, grace_s
from plumbing.grpc_util import SERVER_OPTIONS, start_server
from plumbing.rpc_stream import StreamGate
from plumbing.security import ServerTLS
from protos import draft_pb2, draft_pb2_grpc

log = logging.getLogger("splitspec.draft")
SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftModel"].full_name


def build_drafter(config: DraftConfig) -> Drafter:
    if config.method == "ngram":
        return NgramContextDrafter(config.shape)
    if config.method == "eagle":
        return _build_eagle(config)
    # Test-only drafters are imported only when asked for.
    from draft_service.test_drafters import RecordingDrafter, ScriptedDrafter

    if config.method == "scripted":
        assert config.script is not None
        return ScriptedDrafter.from_file(config.shape, config.script)
    assert config.record_dir is not None
    return RecordingDrafter(config.shape, config.record_dir)


def _build_eagle(config: DraftConfig) -> Drafter:
    from draft_service.eagle.factory import build_eagle_drafter  # torch model code: load on demand

    return build_eagle_drafter(
        config.model_path,
        config.eagle_head,
        config.cache_dir,
        config.shape,
        config.dtype,
        config.device,
        cuda_graphs=config.cuda_graphs,
        prepack=config.prepack_weights,
        few_row_kernel=config.few_row_kernel,
        packed_weights=config.packed_weights,
    )


def overload_errors(config: DraftConfig) -> tuple[type[Exception], ...]:
    """The drafter's "no room now" exceptions, answered with RESOURCE_EXHAUSTED."""
    if config.method != "eagle":
        return ()
    from draft_service.eagle.pool import DraftPoolFull

    return (DraftPoolFull,)


def draft_info(drafter: Drafter, config: DraftConfig) -> draft_pb2.DraftInfo:
    return draft_pb2.DraftInfo(
        method=drafter.method,
        needs_hidden=drafter.needs_hidden,
        hidden_size=int(getattr(drafter, "hidden_size", 0)),
        vocab_size=int(getattr(drafter, "vocab_size", 0)),
        num_steps=config.num_steps,
        topk=config.topk,
        num_draft_tokens=config.num_draft_tokens,
        device=config.device,
        dtype=config.dtype,
    )


def load_drafter(config: DraftConfig) -> Drafter:
    """The configured drafter, with the process-wide settings the service runs it under."""
    if config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    if config.device.startswith("cuda"):
        from model_runtime.cuda_setup import prefer_efficient_attention
        from model_runtime.fused import use_fused_kernels

        prefer_efficient_attention()
        use_fused_kernels(True)  # RMSNorm, rotary and SiLU as one Triton kernel each
    return build_drafter(config)


def serve(config: DraftConfig, tls: ServerTLS | None = None) -> None:
    compute = ComputeThread("draft-compute")
    drafter = compute.run(load_drafter, config)  # loads on the thread that runs it
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers), options=SERVER_OPTIONS
    )
    engine = DraftEngine(drafter, overload_errors(config))
    # An open stream holds a worker: half of them stay for unary calls and health checks.
    streams = StreamGate(max_open=max(1, config.max_workers // 2))
    servicer = DraftServicer(engine, draft_info(drafter, config), compute, streams)
    draft_pb2_grpc.add_DraftModelServicer_to_server(servicer, server)
    address = f"{config.host}:{config.port}"
    health, address = start_server(server, [SERVICE_NAME], address, "draft", tls)
    drain_on_sigterm(server, health, grace_s(5.0), streams)
    log.info(
        "draft (%s) serving on %s (%s, %s; tree: %d steps, topk %d, %d tokens)",
        drafter.method,
        address,
        config.device,
        config.dtype,
        config.num_steps,
        config.topk,
        config.num_draft_tokens,
    )
    server.wait_for_termination()


def main(argv: list[str] | None = None) -> None:
    run_service("draft", __doc__, add_arguments, config_from_args, serve, argv)
