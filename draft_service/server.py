"""Runs a draft replica: `python -m draft_service --method ngram|eagle|scripted|recording`.

"scripted" and "recording" are test-only drafters (see draft_service/test_drafters.py).
"""

from __future__ import annotations

import argparse
import logging
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from draft_service.drafter import Drafter, TreeShape
from draft_service.ngram_drafter import NgramContextDrafter
from draft_service.servicer import DraftEngine, DraftServicer
from model_runtime.config import DTYPE_CHOICES, DTYPES, resolve_dtype
from model_runtime.service_main import add_endpoint_flags, run_service
from plumbing.arg_types import NON_NEGATIVE_INT, POSITIVE_INT, TREE_TOKENS
from plumbing.compute_thread import ComputeThread
from plumbing.drain import drain_on_sigterm, grace_s
from plumbing.grpc_util import SERVER_OPTIONS, start_server
from plumbing.paths import add_cache_dir_flag, default_cache_dir
from plumbing.rpc_stream import StreamGate
from plumbing.security import ServerTLS
from protos import draft_pb2, draft_pb2_grpc

log = logging.getLogger("splitspec.draft")
SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftModel"].full_name
METHODS = ("ngram", "eagle", "scripted", "recording")


@dataclass(frozen=True)
class DraftConfig:
    """The draft service's configuration: built once from the command line, never mutated."""

    method: str
    cache_dir: Path
    host: str = "127.0.0.1"
    port: int = 50071
    num_steps: int = 5
    topk: int = 4
    num_draft_tokens: int = 16
    device: str = "cpu"
    dtype: str = "float32"
    model_path: Path | None = None  # the target model (eagle: embeddings, LM head, tokenizer)
    eagle_head: Path | None = None  # folder of the trained EAGLE head
    script: Path | None = None  # scripted: JSON list of token-id sequences
    record_dir: Path | None = None  # recording: where per-request records are written
    max_workers: int = 8
    num_threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    cuda_graphs: bool = True  # eagle on CUDA: the tree search and the append replay CUDA graphs

    def __post_init__(self) -> None:
        if self.num_threads < 0:
            raise ValueError("threads must be >= 0")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {METHODS}")
        if self.dtype not in DTYPES.values():
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {sorted(DTYPES)}")
        if self.method == "scripted" and self.script is None:
            raise ValueError("method scripted needs --script FILE")
        if self.method == "recording" and self.record_dir is None:
            raise ValueError("method recording needs --record-dir DIR")
        _ = self.shape  # TreeShape validates the tree budget

    @property
    def shape(self) -> TreeShape:
        return TreeShape(
            num_steps=self.num_steps, topk=self.topk, num_draft_tokens=self.num_draft_tokens
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_endpoint_flags(parser, default_port=50071)
    _add_drafter_flags(parser.add_argument_group("drafter"))
    _add_device_flags(parser.add_argument_group("device"))
    _add_test_drafter_flags(parser.add_argument_group("test drafters"))


def _add_drafter_flags(group: argparse._ArgumentGroup) -> None:
    tree = "default by device: 5, 4, 16 on CPU; 8, 8, 64 for EAGLE on CUDA"
    group.add_argument(
        "--method",
        default="ngram",
        choices=METHODS,
        help="scripted and recording are for tests only",
    )
    group.add_argument("--num-steps", type=POSITIVE_INT, help=f"tree depth (draft steps); {tree}")
    group.add_argument("--topk", type=POSITIVE_INT, help=f"children expanded per node; {tree}")
    group.add_argument(
        "--num-draft-tokens", type=TREE_TOKENS, help=f"most nodes, root included; {tree}"
    )
    group.add_argument("--model", type=Path, default=None, help="target model path (eagle)")
    group.add_argument("--eagle-head", type=Path, default=None, help="EAGLE head folder (eagle)")


def _add_device_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--device", default=None, help="default: cuda when available for eagle, else cpu"
    )
    group.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPE_CHOICES,
        help="auto: bfloat16 on CUDA and on CPUs with native bf16, else float32",
    )
    group.add_argument(
        "--threads",
        type=NON_NEGATIVE_INT,
        default=0,
        help="torch CPU threads (0: torch's default, all cores). At batch 1 the target and "
        "the drafter take turns; on a 2-core CPU two draft threads cut a draft round from "
        "~33 to ~30 ms",
    )
    group.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="eagle on CUDA: the tree search and the round's append, for up to 32 requests, "
        "replay CUDA graphs captured at start-up (--no-cuda-graphs runs them eagerly)",
    )
    add_cache_dir_flag(group)


def _add_test_drafter_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--script",
        type=Path,
        default=None,
        help="scripted: JSON list of token-id sequences to propose from",
    )
    group.add_argument(
        "--record-dir",
        type=Path,
        default=None,
        help="recording: writes DIR/<request_id>.json on every update",
    )


# (steps, topk, tokens) where the flags leave them out. On the H200 a 64-node verify costs about
# what a 16-node one does and a bigger tree accepts more: 3.04 against 2.55 tokens a round,
# 0.46x against 0.42x target-only (benchmarks/results/gpu_tree_shapes_2026-12-01.json).
CPU_TREE = (5, 4, 16)
CUDA_EAGLE_TREE = (8, 8, 64)


def config_from_args(args: argparse.Namespace) -> DraftConfig:
    device = args.device
    if device is None:
        device = "cuda" if args.method == "eagle" and torch.cuda.is_available() else "cpu"
    on_gpu = args.method == "eagle" and device.startswith("cuda")
    defaults = CUDA_EAGLE_TREE if on_gpu else CPU_TREE
    given = (args.num_steps, args.topk, args.num_draft_tokens)
    num_steps, topk, num_draft_tokens = (
        g if g is not None else d for g, d in zip(given, defaults, strict=True)
    )
    return DraftConfig(
        method=args.method,
        cache_dir=args.cache_dir or default_cache_dir(),
        host=args.host,
        port=args.port,
        num_steps=num_steps,
        topk=topk,
        num_draft_tokens=num_draft_tokens,
        device=device,
        dtype=resolve_dtype(args.dtype, device),
        model_path=args.model,
        eagle_head=args.eagle_head,
        script=args.script,
        record_dir=args.record_dir,
        num_threads=args.threads,
        cuda_graphs=args.cuda_graphs,
    )


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
