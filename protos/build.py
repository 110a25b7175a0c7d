"""Regenerates the Python code for every .proto in this folder.

Run from the repository root: ``python -m protos.build``. The output (``*_pb2.py``,
``*_pb2_grpc.py``, ``*_pb2.pyi``) is committed; ``tests/test_protos.py`` fails when it is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> None:
    """Writes generated modules under ``out_root/protos/``."""
    from grpc_tools import protoc  # dev dependency: only this script needs it

    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    for proto in proto_files():
        args = [
            "protoc",
            f"-I{REPO_ROOT}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(proto.relative_to(REPO_ROOT)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto.name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root")
    generate(parser.parse_args().out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
