"""First-start work of a local stack, done before its services start, with progress and times.

`splitspec serve` runs this as its own process (``python -m splitspec.prepare``) so that a cold
start says what it is doing: the model's conversion (a progress bar from transformers) and the
kernel build, each with its time. The services would do the same work themselves (under the
same locks, plumbing/once.py); after this they find it done. Exit code 2 and one line on stderr
when the cache folder cannot be written or the model is not there.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from model_runtime.loading import ModelNotFound
from plumbing.flag_hints import HintingParser
from plumbing.once import CacheWriteError, ensure_writable
from plumbing.paths import add_cache_dir_flag, default_cache_dir


def prepare(model: Path | None, cache_dir: Path, kernel: bool) -> None:
    from model_runtime.loading import (
        converted_dir,
        default_model_path,
        find_gguf,
        is_gguf,
        resolve_checkpoint,
    )

    ensure_writable(cache_dir)
    path = model or default_model_path()
    if is_gguf(path) and not converted_dir(find_gguf(path), cache_dir).exists():
        _timed(
            f"model: converting {find_gguf(path).name} (once per cache)",
            lambda: resolve_checkpoint(path, cache_dir),
        )
    if kernel:
        from kernels import few_row_linear

        if (
            few_row_linear.unavailable_reason() is None
            and not few_row_linear.build_folder(cache_dir).exists()
        ):
            _timed(
                "kernel: building the few-row linear kernel (once per cache)",
                lambda: few_row_linear.load(cache_dir),
            )


def _timed(what: str, work) -> None:
    print(f"{what} ...", flush=True)
    started = time.monotonic()
    work()
    print(f"{what}: done in {time.monotonic() - started:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = HintingParser(prog="python -m splitspec.prepare", description=__doc__)
    parser.add_argument("--model", type=Path, default=None)
    add_cache_dir_flag(parser)
    parser.add_argument("--kernel", action="store_true", help="also build the few-row kernel")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    # Who does the work: "waiting for pid N" when another process (a second stack) holds the
    # lock, "done in" from the one that built.
    logging.getLogger("splitspec.cache").setLevel(logging.INFO)
    cache_dir = args.cache_dir or default_cache_dir()
    try:
        prepare(args.model, cache_dir, args.kernel)
    except (CacheWriteError, ModelNotFound) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
