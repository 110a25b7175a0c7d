"""The stack benchmarks/reliability.py runs against: target and router on the CPU, two EAGLE
replicas, an API key, and admission sized so that every stream runs and speculates at once."""

from __future__ import annotations

import os
from pathlib import Path

from splitspec.launcher import LocalStack
from tests.helpers import hostile

KEY_ENV = "SPLITSPEC_RELIABILITY_KEY"


def suite_stack(log_dir: Path, streams: int, key: str) -> LocalStack:
    """Not started yet. The router reads ``key`` from KEY_ENV, set here before its process
    starts; the request size limits are the ones the hostile cases are written against."""
    os.environ[KEY_ENV] = key
    eagle = ["--method", "eagle", "--threads", "1", "--device", "cpu"]
    admission = ["--max-queue", str(streams), "--max-running", str(streams),
                 "--max-speculative-batch", str(streams)]  # fmt: skip
    limits = ["--max-prompt-tokens", str(hostile.MAX_PROMPT_TOKENS),
              "--max-request-bytes", str(hostile.MAX_REQUEST_BYTES)]  # fmt: skip
    return LocalStack(
        ["--device", "cpu", "--dtype", "float32", "--threads", "1"],
        ["--api-key-env", KEY_ENV, *admission, *limits],
        log_dir=log_dir,
        draft_args=[eagle, eagle],
        api_key=key,
    )
