"""A device this machine cannot run is one line from `serve` and from each model service, before
anything loads; so is a target setting out of range."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from model_runtime.cuda_setup import device_problem
from tests.helpers.commands import Commands, started_together

pytestmark = pytest.mark.timeout(120)


def test_device_problem_names_what_is_wrong() -> None:
    assert device_problem("cpu") == ""
    assert "unknown device" in device_problem("gpu")
    assert "unknown device" in device_problem("cuda:first")
    if torch.cuda.is_available():
        assert device_problem("cuda") == device_problem("cuda:0") == ""
        assert f"has {torch.cuda.device_count()} CUDA device(s)" in device_problem("cuda:99")
    else:
        assert "sees no CUDA device on this machine; use --device cpu" in device_problem("cuda")


@pytest.fixture(scope="module")
def commands() -> Iterator[Commands]:
    with started_together({
        "serve": ["splitspec.cli", "serve", "--port", "0", "--device", "cuda:99", "--demo"],
        "target_service": ["target_service", "--port", "0", "--device", "cuda:99"],
        "draft_service": ["draft_service", "--port", "0", "--device", "cuda:99", "--method",
                          "ngram"],
        "slots": ["target_service", "--port", "0", "--num-slots", "0"],
    }) as started:  # fmt: skip
        yield started


def test_serve_refuses_a_device_it_cannot_run_before_starting_anything(
    commands: Commands,
) -> None:
    done = commands.result("serve")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {device_problem('cuda:99')}"
    assert "starting target" not in done.stdout and "model:" not in done.stdout


@pytest.mark.parametrize("service", ["target_service", "draft_service"])
def test_a_model_service_refuses_a_device_it_cannot_run(service: str, commands: Commands) -> None:
    done = commands.result(service)
    name = service.removesuffix("_service")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"{name}: {device_problem('cuda:99')}"
    assert "Traceback" not in done.stderr


def test_a_target_setting_out_of_range_is_a_usage_error(commands: Commands) -> None:
    done = commands.result("slots")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == "splitspec target: error: argument --num-slots: must be >= 1, got 0"
    assert "Traceback" not in done.stderr
