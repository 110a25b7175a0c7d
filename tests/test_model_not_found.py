"""A model (or an EAGLE head) that is not there is one line from `serve` (before any service
starts) and from each model service, not a traceback from the loader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.commands import Commands, started_together

pytestmark = pytest.mark.timeout(120)
EAGLE_CPU = ["--method", "eagle", "--device", "cpu"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("no-model")  # empty: no .gguf, no head


@pytest.fixture(scope="module")
def commands(folder: Path) -> Iterator[Commands]:
    missing = str(folder / "nowhere.gguf")
    with started_together({
        "target_service": ["target_service", "--port", "0", "--model", missing],
        "draft_service": ["draft_service", "--port", "0", "--model", missing, *EAGLE_CPU],
        "folder": ["target_service", "--port", "0", "--model", str(folder)],
        "serve": ["splitspec.cli", "serve", "--port", "0", "--model", missing, "--demo"],
        "head": ["draft_service", "--port", "0", *EAGLE_CPU, "--eagle-head", str(folder)],
    }) as started:  # fmt: skip
        yield started


@pytest.mark.parametrize("service", ["target_service", "draft_service"])
def test_a_model_service_names_the_missing_model(
    service: str, folder: Path, commands: Commands
) -> None:
    done = commands.result(service)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(f"model {folder / 'nowhere.gguf'}: no such file or folder"), last
    assert "Traceback" not in done.stderr


def test_a_folder_without_one_gguf_is_named(folder: Path, commands: Commands) -> None:
    done = commands.result("folder")
    assert done.returncode == 2
    assert f"model {folder}: expected exactly one .gguf file, found 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_names_the_missing_model_before_starting_anything(
    folder: Path, commands: Commands
) -> None:
    done = commands.result("serve")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: model {folder / 'nowhere.gguf'}: no such file or folder"
    assert "starting target" not in done.stdout


def test_an_eagle_head_folder_without_a_head_is_named(folder: Path, commands: Commands) -> None:
    done = commands.result("head")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.endswith(f"draft: EAGLE head {folder}: no eagle_config.json there (a head "
                         "folder is what `splitspec train-draft` writes)"), last  # fmt: skip
    assert "Traceback" not in done.stderr
