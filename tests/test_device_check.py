"""A device this machine cannot run is one line from `serve` and from each model service, before
anything loads; so is a target setting out of range."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from model_runtime.cuda_setup import device_problem

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


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=90)  # fmt: skip


def test_serve_refuses_a_device_it_cannot_run_before_starting_anything() -> None:
    done = run("splitspec.cli", "serve", "--port", "0", "--device", "cuda:99", "--demo")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {device_problem('cuda:99')}"
    assert "starting target" not in done.stdout and "model:" not in done.stdout


@pytest.mark.parametrize("service", ["target_service", "draft_service"])
def test_a_model_service_refuses_a_device_it_cannot_run(service: str) -> None:
    args = ["--method", "ngram"] if service == "draft_service" else []
    done = run(service, "--port", "0", "--device", "cuda:99", *args)
    name = service.removesuffix("_service")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == f"{name}: {device_problem('cuda:99')}"
    assert "Traceback" not in done.stderr


def test_a_target_setting_out_of_range_is_a_usage_error() -> None:
    done = run("target_service", "--port", "0", "--num-slots", "0")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == "splitspec target: error: num_slots must be positive"
    assert "Traceback" not in done.stderr
