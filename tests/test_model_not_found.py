"""A model (or an EAGLE head) that is not there is one line from `serve` (before any service
starts) and from each model service, not a traceback from the loader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=90)  # fmt: skip


@pytest.mark.parametrize("service", ["target_service", "draft_service"])
def test_a_model_service_names_the_missing_model(service: str, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"
    args = ["--method", "eagle", "--device", "cpu"] if service == "draft_service" else []
    done = run(service, "--port", "0", "--model", str(missing), *args)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(f"model {missing}: no such file or folder")
    assert "Traceback" not in done.stderr


def test_a_folder_without_one_gguf_is_named(tmp_path: Path) -> None:
    done = run("target_service", "--port", "0", "--model", str(tmp_path))
    assert done.returncode == 2
    assert f"model {tmp_path}: expected exactly one .gguf file, found 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_names_the_missing_model_before_starting_anything(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"
    done = run("splitspec.cli", "serve", "--port", "0", "--model", str(missing), "--demo")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: model {missing}: no such file or folder"
    assert "starting target" not in done.stdout


def test_an_eagle_head_folder_without_a_head_is_named(tmp_path: Path) -> None:
    done = run("draft_service", "--port", "0", "--method", "eagle", "--device", "cpu",
               "--eagle-head", str(tmp_path))  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(f"draft: EAGLE head {tmp_path}: no eagle_config.json there (a head "
                         "folder is what `splitspec train-draft` writes)"), last  # fmt: skip
    assert "Traceback" not in done.stderr
