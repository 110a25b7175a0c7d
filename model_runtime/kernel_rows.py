"""How far past its 16 rows the few-row kernel keeps a weight's steps, in blocks of 16.

The kernel reads a weight once per 16 rows; torch's sgemm reads it once for all rows and
overtakes the kernel at a row count that depends on the CPU and the shape. On the 2-core AMD
EPYC dev box (2026-12-06, 2 threads) SmolLM2's 30 layers took 34 ms in blocks against 49 ms
with torch at 32 rows (a batch-2 verify of 16-node trees) and 294 against 352 at 256 rows, the
LM head 9.5 against 25 at 32 rows; the small 192 x 576 k and v projections stayed on torch past
16. So each weight shape is timed both ways at CANDIDATE_ROWS, once per CPU model, torch
version and thread count, and keeps the kernel up to the last count where it won at every
count so far. The verdicts live in the cache folder (``kernels/few_row_limits.json``), so later
starts and the other services read them instead of timing again.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.few_row_linear import MAX_ROWS as BLOCK_ROWS  # the kernel's most rows a call
from model_runtime import quantized_pack
from model_runtime.config import CPUINFO

CANDIDATE_ROWS = (32, 64, 128, 256)
REPEATS = 3  # the best of these, both ways: one slow call must not decide
LIMITS_FILE = "few_row_limits.json"

FewRowFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def in_blocks(few_row: FewRowFn, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ weight.T through the kernel, BLOCK_ROWS rows a call (a row's bits do not depend on
    the rows beside it)."""
    blocks = [few_row(x[i : i + BLOCK_ROWS], packed) for i in range(0, x.shape[0], BLOCK_ROWS)]
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks)


def row_limit(
    few_row: FewRowFn, weight: torch.Tensor, packed: torch.Tensor, cache_dir: Path | None
) -> int:
    """The most rows a step of this weight's shape sends through the kernel."""
    threads = torch.get_num_threads()
    key = f"{cpu_model()}|torch {torch.__version__}|{threads} threads|{tuple(weight.shape)}"
    if packed.dtype != torch.float32:  # a bf16 or quantized copy streams fewer bytes
        key += f"|{quantized_pack.kind(packed)} weights"
    folder = cache_dir / "kernels" if cache_dir is not None else None
    known = _read(folder)
    if key not in known:
        known[key] = measure(few_row, weight, packed)
        if folder is not None:
            _write(folder, {**_read(folder), key: known[key]})
    return int(known[key])


def measure(few_row: FewRowFn, weight: torch.Tensor, packed: torch.Tensor) -> int:
    limit = BLOCK_ROWS
    generator = torch.Generator().manual_seed(0)
    for rows in CANDIDATE_ROWS:
        x = torch.randn(rows, weight.shape[1], generator=generator)
        kernel_s = _best_time(lambda: in_blocks(few_row, x, packed))  # noqa: B023 (called here)
        torch_s = _best_time(lambda: F.linear(x, weight))  # noqa: B023
        if kernel_s >= torch_s:
            break
        limit = rows
    return limit


def _best_time(call: Callable[[], object]) -> float:
    call()  # warm: first-touch pages, thread pool
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """/proc/cpuinfo's model name ("unknown" where it cannot be read)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _read(folder: Path | None) -> dict[str, int]:
    if folder is None:
        return {}
    try:
        return dict(json.loads((folder / LIMITS_FILE).read_text()))
    except (OSError, ValueError):  # none yet, or not JSON: time again
        return {}


def _write(folder: Path, limits: dict[str, int]) -> None:
    """Atomically (a rename), since the target and its drafters may start at once; a cache
    folder that cannot be written only costs the next start its timing."""
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".few_row_limits-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(limits, out, indent=1, sort_keys=True)
            os.replace(tmp, folder / LIMITS_FILE)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # left only where the rename did not happen
