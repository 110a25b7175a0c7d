"""The generated protobuf/gRPC code committed in protos/ is what `python -m protos.build` makes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from protos import build

GENERATED_PATTERNS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")


def generated_files(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for pattern in GENERATED_PATTERNS
        for p in sorted(folder.glob(pattern))
    }


def stale_files(committed: dict[str, bytes], fresh: dict[str, bytes]) -> list[str]:
    names = sorted(committed.keys() | fresh.keys())
    return [n for n in names if committed.get(n) != fresh.get(n)]


def test_committed_code_is_regenerated_byte_for_byte(tmp_path: Path) -> None:
    build.generate(tmp_path)
    fresh = generated_files(tmp_path / "protos")
    committed = generated_files(build.PROTO_DIR)
    # Three files per .proto; a missing or extra file counts as stale too.
    assert len(fresh) == 3 * len(build.proto_files()) > 0
    stale = stale_files(committed, fresh)
    assert not stale, f"stale generated code {stale}: run `python -m protos.build`"


def test_an_edited_proto_makes_the_committed_code_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check above must be able to fail: regenerate from a copy of protos/ with one more
    # message and compare with the committed code.
    repo = tmp_path / "repo"
    shutil.copytree(build.PROTO_DIR, repo / "protos", ignore=shutil.ignore_patterns("*.py*"))
    edited = repo / "protos" / "generation.proto"
    edited.write_text(edited.read_text() + "\nmessage OnlyInThisTest {\n  int32 x = 1;\n}\n")
    monkeypatch.setattr(build, "REPO_ROOT", repo)
    monkeypatch.setattr(build, "PROTO_DIR", repo / "protos")
    out = tmp_path / "out"
    build.generate(out)
    stale = stale_files(
        generated_files(Path(__file__).parents[1] / "protos"), generated_files(out / "protos")
    )
    assert {"generation_pb2.py", "generation_pb2.pyi"} <= set(stale)
