"""The few-row fp32 linear kernel (few_row_linear.cpp): build, load, and its torch reference.

It is compiled on first use with torch's extension builder (g++ and ninja) into
``<cache>/kernels/``, which takes under a minute on 2 cores once per machine and torch version;
``python -m kernels.few_row_linear`` builds it ahead (``make install`` does). Where it cannot be
built or run (no AVX-512, no compiler, not x86) ``load()`` returns None and callers keep torch's
kernels.
"""

from __future__ import annotations

import functools
import logging
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("splitspec.kernels")

SOURCE = Path(__file__).resolve().parent / "few_row_linear.cpp"
BLOCK = 16  # output columns per packed block
MAX_ROWS = 16  # the most rows of x one call takes (MAX_ROWS in the .cpp)
FLAGS = ["-O3", "-mavx512f", "-mfma", "-fopenmp"]
# torch's builder holds a lock file while it compiles and waits for it forever; one older than
# this was left by a build that was killed (a build takes under a minute).
STALE_LOCK_S = 600


def unavailable_reason() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can."""
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return f"the CPU lacks AVX-512 (torch reports {capability})"
    for tool in ("g++", "ninja"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@functools.cache
def load(cache_dir: Path | None = None) -> ModuleType | None:
    """The compiled module, building it if needed; None (logged once) when it cannot be had."""
    reason = unavailable_reason()
    if reason is not None:
        log.warning("few-row linear kernel off: %s; verify steps use torch's kernels", reason)
        return None
    from torch.utils.cpp_extension import load as build_extension

    from splitspec.paths import default_cache_dir

    build_dir = (cache_dir or default_cache_dir()) / "kernels" / f"torch-{torch.__version__}"
    build_dir.mkdir(parents=True, exist_ok=True)
    _drop_stale_lock(build_dir / "lock")
    started = time.monotonic()
    try:
        module = build_extension(
            "splitspec_few_row_linear",
            [str(SOURCE)],
            extra_cflags=FLAGS,
            build_directory=str(build_dir),
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError) as err:
        log.warning("few-row linear kernel off: building it failed (%s)", err)
        return None
    took = time.monotonic() - started
    if took > 5:
        log.info("built the few-row linear kernel in %.0f s (%s)", took, build_dir)
    return module


def _drop_stale_lock(lock: Path) -> None:
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_S:
            lock.unlink()
            log.warning("removed a stale kernel build lock (%s)", lock)
    except FileNotFoundError:
        pass


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What ``module.linear(x, module.pack(weight))`` computes, in plain torch."""
    return x @ weight.T


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
    print("building the few-row linear kernel (under a minute, once) ...", flush=True)
    module = load()
    if module is None:
        print(f"not built: {unavailable_reason() or 'see the warning above'}")
        return 0  # not an error: the services fall back to torch's kernels
    weight, x = torch.randn(48, 40), torch.randn(3, 40)
    got = module.linear(x, module.pack(weight))
    torch.testing.assert_close(got, reference(x, weight), rtol=1e-5, atol=1e-5)
    print("few-row linear kernel ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
