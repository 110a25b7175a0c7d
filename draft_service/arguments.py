"""The draft service's command line and configuration (`python -m draft_service --help`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from draft_service.drafter import TreeShape
from kernels import few_row_linear
from model_runtime.config import DTYPE_CHOICES, DTYPES, resolve_dtype
from model_runtime.service_main import add_endpoint_flags
from plumbing.arg_types import NON_NEGATIVE_INT, POSITIVE_INT, TREE_TOKENS
from plumbing.paths import add_cache_dir_flag, default_cache_dir

METHODS = ("ngram", "eagle", "scripted", "recording")
PACKED_WEIGHTS = ("bfloat16", "float32")


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
    prepack_weights: bool = True  # eagle on CPU fp32: the head's few-row steps on packed weights
    few_row_kernel: bool = True  # pack for kernels/few_row_linear.cpp (else MKL's sgemm)
    packed_weights: str = "bfloat16"  # the kernel's copy of the head's weights (--packed-weights)

    def __post_init__(self) -> None:
        if self.num_threads < 0:
            raise ValueError("threads must be >= 0")
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {METHODS}")
        if self.packed_weights not in PACKED_WEIGHTS:
            raise ValueError(f"packed weights must be one of {PACKED_WEIGHTS}")
        if self.dtype not in DTYPES.values():
            raise ValueError(f"unknown dtype {self.dtype!r}; choose one of {sorted(DTYPES)}")
        if self.eagle_head is not None and self.method != "eagle":
            raise ValueError(f"--eagle-head is for --method eagle, not {self.method}")
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
    tree = (
        "default by drafter and device: EAGLE 5, 4, 8 on CPU (5, 4, 6 where the CPU has AVX2 "
        "but not AVX-512), 8, 8, 64 on CUDA; n-gram 5, 4, 16"
    )
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
        help="auto: bfloat16 on CUDA and on CPUs with native bf16, else float32; but float32 "
        "for an EAGLE head where the few-row kernel runs and the CPU has no AMX",
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
    _add_cpu_kernel_flags(group)
    add_cache_dir_flag(group)


def _add_cpu_kernel_flags(group: argparse._ArgumentGroup) -> None:
    """The EAGLE head's few-row steps on a CPU in fp32 (kernels/few_row_linear.cpp)."""
    group.add_argument(
        "--no-prepack",
        dest="prepack",
        action="store_false",
        help="eagle on a CPU in fp32: keep torch's kernels for the head's few-row steps "
        "(prepacked by default, at the cost of a second copy of the head's weights, in bf16 "
        "by default: see --packed-weights)",
    )
    group.add_argument(
        "--no-few-row-kernel",
        dest="few_row_kernel",
        action="store_false",
        help="prepack for MKL's sgemm instead of the project's few-row kernel "
        "(kernels/few_row_linear.cpp)",
    )
    group.add_argument(
        "--packed-weights",
        choices=PACKED_WEIGHTS,
        default="bfloat16",
        help="eagle on a CPU in fp32: the few-row kernel's copy of the head's weights. "
        "bfloat16 halves the bytes a draft step reads (the head's weights are rounded to it "
        "for every step; the output never changes)",
    )


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
# 0.46x against 0.42x target-only (benchmarks/results/gpu_tree_shapes_2026-12-01.json). On a
# CPU a verify is bound by its multiply-adds, so its cost follows the node count: with decode
# steps made cheap (quantized copies, the paged attention) 8 nodes beat 16 in each of six paired
# runs on ShareGPT and HumanEval (docs/cpu.md, "Tree shapes"). Where the few-row kernel takes
# fewer than 8 rows a pass over its weights (AVX2: 6), a tree of one pass's nodes is faster:
# on a 2-core AVX2 EPYC 5, 4, 6 gave 1.05-1.08x 5, 4, 8's EAGLE tok/s over two paired runs in
# both orders (docs/cpu.md). The kernel is this machine's, which is the target's where they
# share it (`splitspec serve`). The n-gram drafter's default was
# not measured against it and stays.
CPU_EAGLE_TREE = (5, 4, 8)
CUDA_EAGLE_TREE = (8, 8, 64)
NGRAM_TREE = (5, 4, 16)


def config_from_args(args: argparse.Namespace) -> DraftConfig:
    device = args.device
    if device is None:
        device = "cuda" if args.method == "eagle" and torch.cuda.is_available() else "cpu"
    on_gpu = args.method == "eagle" and device.startswith("cuda")
    defaults = NGRAM_TREE
    if args.method == "eagle":
        defaults = CUDA_EAGLE_TREE if on_gpu else cpu_eagle_tree()
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
        dtype=resolve_dtype(args.dtype, device, _fp32_kernel_runs(args, device)),
        model_path=args.model,
        eagle_head=args.eagle_head,
        script=args.script,
        record_dir=args.record_dir,
        num_threads=args.threads,
        cuda_graphs=args.cuda_graphs,
        prepack_weights=args.prepack,
        few_row_kernel=args.few_row_kernel,
        packed_weights=args.packed_weights,
    )


def cpu_eagle_tree() -> tuple[int, int, int]:
    """CPU_EAGLE_TREE with no more nodes than one pass of this machine's few-row kernel takes."""
    steps, topk, nodes = CPU_EAGLE_TREE
    rows = few_row_linear.rows_per_pass()
    return steps, topk, min(nodes, rows) if rows else nodes


def _fp32_kernel_runs(args: argparse.Namespace, device: str) -> bool:
    """Whether an EAGLE head in float32 would run its few-row steps on the project's kernel
    (which makes "auto" pick float32 on a CPU: model_runtime.config.resolve_dtype)."""
    if args.method != "eagle" or device != "cpu" or not (args.prepack and args.few_row_kernel):
        return False
    return few_row_linear.unavailable_reason() is None
