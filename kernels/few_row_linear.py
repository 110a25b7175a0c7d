"""The CPU kernels: the few-row linear (few_row_linear.cpp: fp32 rows, the weight packed in fp32,
bf16, or the Q4_1 / Q8_0 blocks its values came from: quantized_search.h finds them,
quantized_weights.h reads them) and the exact paged attention (exact_attention.h), built as one
module (bindings.cpp binds them); build, load, the linear's reference.

It is compiled on first use with torch's extension builder (g++ and ninja) into
``<cache>/kernels/``, which takes 10-30 s on 2 cores (AVX2 on a 2-core EPYC: 16-19 s,
AVX-512 on another: 10.3-13.8 s; two translation units compiled at once) once per cache,
source, instruction set and torch version; ``python -m kernels.few_row_linear`` builds it ahead
(``make install`` does). It is built for AVX-512 where the CPU has it, else for AVX2 with FMA
and F16C (simd16.h: the same 16-lane code and the same bits either way). Where it cannot be
built or run (neither, no compiler, not x86) ``load()`` returns None and callers keep torch's
kernels.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

from plumbing.once import CacheWriteError, build_once

log = logging.getLogger("splitspec.kernels")

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "few_row_linear.cpp"
# Compiled beside SOURCE (kernels/exports.h says why there are two).
BINDINGS = HERE / "bindings.cpp"
HEADERS = (
    "simd16.h",
    "check.h",
    "exact_attention.h",
    "attention_tile.h",
    "vector_math.h",
    "quantized_weights.h",
    "quantized_search.h",
    "row_ops.h",
    "round_ops.h",
    "tensor_api.h",
    "exports.h",
)
# The build key covers them all.
SOURCES = [SOURCE, BINDINGS, *(HERE / header for header in HEADERS)]
BLOCK = 16  # output columns per packed block
MAX_ROWS = 16  # the most rows of x one call takes (MAX_ROWS in the .cpp)
# The compiler flags per instruction set (simd16.h picks its vectors by what they enable).
FLAGS = {
    "avx512": ["-O3", "-mavx512f", "-mfma", "-fopenmp"],
    "avx2": ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"],
}
MODULE_NAME = "splitspec_few_row_linear"


@functools.cache
def instruction_set() -> str | None:
    """"avx512" or "avx2" (with FMA and F16C): what the kernels are built for here; None if
    neither. torch's capability reads AVX2 only where FMA is there too."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return "avx512"
    if capability == "AVX2" and "f16c" in cpu_flags():
        return "avx2"
    return None


# Rows of x one pass over a chunk of weights takes, by build (ROWS_PER_PASS in the .cpp: the
# accumulators that fit the ISA's vector registers); more rows take further passes.
ROWS_PER_PASS = {"avx512": 16, "avx2": 6}


def rows_per_pass() -> int | None:
    """What one pass of this machine's build takes; None where the kernel cannot run."""
    isa = instruction_set()
    return ROWS_PER_PASS[isa] if isa and unavailable_reason() is None else None


def unavailable_reason() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can."""
    if instruction_set() is None:
        capability = torch.backends.cpu.get_cpu_capability()
        return f"the CPU lacks AVX-512 and AVX2 with F16C (torch reports {capability})"
    for tool in ("g++", "ninja"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def cpu_flags() -> set[str]:
    """The first CPU's feature flags; where /proc/cpuinfo cannot be read, the ones every AVX2
    CPU has (torch's capability has already said AVX2)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"f16c"}
    return set(next((line for line in text.splitlines() if line.startswith("flags")), "").split())


@functools.cache
def load(cache_dir: Path | None = None, isa: str | None = None) -> ModuleType | None:
    """The compiled module, building it if needed; None (logged once) when it cannot be had.

    It is built once per cache, source, instruction set and torch version, by one process at a
    time: the build runs in a temporary folder that is published whole (plumbing/once.py), so a
    killed build never leaves a half-written module behind, and the others import the published
    one. ``isa`` builds for a lesser instruction set than this CPU's ("avx2" on an AVX-512 CPU:
    tests/test_simd_builds.py compares the two builds).
    """
    reason = unavailable_reason()
    if reason is not None:
        log.warning(
            "few-row linear kernel off: %s; decode and verify steps use torch's or MKL's kernels",
            reason,
        )
        return None
    from plumbing.paths import default_cache_dir

    isa = isa or instruction_set() or "avx512"
    final = build_folder(cache_dir or default_cache_dir(), isa)
    built: list[ModuleType] = []
    if not final.exists():
        log.info(
            "building the few-row linear kernel for %s (once per cache; 10-30 s on 2 cores)",
            isa,
        )
    try:
        build_once(
            final, lambda tmp: built.append(_compile(tmp, isa)), "building the few-row kernel"
        )
        return built[0] if built else _import_built(final, isa)
    except CacheWriteError:
        raise
    except (RuntimeError, OSError, ImportError) as err:
        log.warning("few-row linear kernel off: building it failed (%s)", err)
        return None


def module_name(isa: str) -> str:
    return f"{MODULE_NAME}_{isa}"


def build_folder(cache_dir: Path, isa: str | None = None) -> Path:
    """Where the module for this source, instruction set (this CPU's best unless named) and
    torch lives in ``cache_dir``."""
    isa = isa or instruction_set() or "avx512"
    sources = b"".join(source.read_bytes() for source in SOURCES)
    key = hashlib.sha256(sources + " ".join(FLAGS[isa]).encode()).hexdigest()[:12]
    return cache_dir / "kernels" / f"{module_name(isa)}-torch-{torch.__version__}-{key}"


def _compile(build_dir: Path, isa: str) -> ModuleType:
    from torch.utils.cpp_extension import load as build_extension

    return build_extension(
        module_name(isa),
        [str(SOURCE), str(BINDINGS)],
        extra_cflags=FLAGS[isa],
        build_directory=str(build_dir),
    )


def _import_built(folder: Path, isa: str | None = None) -> ModuleType:
    name = module_name(isa or instruction_set() or "avx512")
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.so")
    if spec is None or spec.loader is None:
        raise ImportError(f"no {name}.so in {folder}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What ``module.linear(x, module.pack(weight))`` computes, in plain torch (a bf16 weight
    is widened to x's dtype: the kernel multiplies in fp32)."""
    return x @ weight.to(x.dtype).T


def supports(weight: torch.Tensor) -> bool:
    """Shapes and types the kernel takes: a CPU fp32 weight with a multiple of 16 outputs."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.shape[0] % BLOCK == 0
    )


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        module = load()
    except CacheWriteError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if module is None:
        print(f"not built: {unavailable_reason() or 'see the warning above'}")
        return 0  # not an error: the services fall back to torch's kernels
    weight, x = torch.randn(48, 40), torch.randn(3, 40)
    for packed_weight in (weight, weight.bfloat16()):
        got = module.linear(x, module.pack(packed_weight))
        torch.testing.assert_close(got, reference(x, packed_weight), rtol=1e-5, atol=1e-5)
    print("few-row linear kernel ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
