"""The target's start-up warm-up (target_service/warm_up.py): a scratch request on the pool's
first slots, released before serving. On the real default model: afterwards the engine holds no
request, and a request on those same slots decodes what it does on an engine that never warmed
up; `serve --no-warm-up` reaches the target; the shared stack's target logged its warm-up."""

from __future__ import annotations

import argparse
import logging
import shutil

import pytest
import torch

from model_runtime.loading import default_model_path, load_model
from plumbing.paths import default_cache_dir
from splitspec.launcher import LocalStack
from splitspec.serve_cli import _local_stack
from splitspec.serve_flags import add_serve_flags
from target_service.arguments import add_arguments, config_from_args
from target_service.config import TargetConfig
from target_service.engine import StepItem, TargetEngine
from target_service.request_table import SamplingSpec
from target_service.server import attach_graphs
from target_service.warm_up import PROMPT_LENGTHS, warm_up
from tests.helpers.prompts import chat_ids

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingSpec(0.0, 1.0, 0, 0)
NUM_NEW = 12


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), torch.float32, torch.device(DEVICE),
                      default_cache_dir())  # fmt: skip


def make_engine(model, **limits: int) -> TargetEngine:
    config = TargetConfig(model_path=default_model_path(), cache_dir=default_cache_dir(),
                          device=DEVICE, max_decode_steps=4, verify_graphs=DEVICE == "cuda",
                          **{"num_slots": 512, **limits})  # fmt: skip
    engine = TargetEngine(config, model)
    attach_graphs(engine, model)
    return engine


def greedy_decode(engine: TargetEngine, prompt: list[int]) -> list[int]:
    """Prefill and NUM_NEW one-token steps on slots 0, 1, ...: those the warm-up wrote."""
    n = len(prompt)
    ids = engine.forward([StepItem("r", prompt, 0, list(range(n)), True, GREEDY)]).next_token_ids
    for position in range(n, n + NUM_NEW - 1):
        step = StepItem("r", [ids[-1]], position, [position])
        ids += engine.forward([step]).next_token_ids
    return ids


def test_warm_up_leaves_nothing_behind(model) -> None:
    prompt = list(chat_ids([{"role": "user", "content": "Name three colours of the rainbow."}]))
    assert len(prompt) > max(PROMPT_LENGTHS)  # the request overwrites every warmed slot
    warmed = make_engine(model)
    assert warm_up(warmed) > 0
    assert warmed.table.ids() == []
    assert greedy_decode(warmed, prompt) == greedy_decode(make_engine(model), prompt)


@pytest.mark.parametrize("limits", [{"num_slots": 16}, {"max_batch_tokens": 16},
                                    {"max_tree_tokens": 2}])  # fmt: skip
def test_warm_up_skips_what_does_not_fit_instead_of_failing_the_start(model, caplog,
                                                                     limits) -> None:  # fmt: skip
    engine = make_engine(model, **limits)
    with caplog.at_level(logging.INFO, logger="splitspec.target"):
        warm_up(engine)
    assert engine.table.ids() == []
    assert "no warm-up: its scratch request does not fit" in caplog.text


def test_no_warm_up_flag_reaches_the_config_and_serve_passes_it_on() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args([])).warm_up
    assert not config_from_args(parser.parse_args(["--no-warm-up"])).warm_up
    serve = argparse.ArgumentParser()
    add_serve_flags(serve)
    for flags, passed in (([], False), (["--no-warm-up"], True)):
        stack = _local_stack(serve.parse_args(flags))  # built, not started
        if stack.log_dir is not None:
            shutil.rmtree(stack.log_dir)
        assert ("--no-warm-up" in stack.target.command) == passed


def test_the_shared_stacks_target_warmed_up_before_serving(stack: LocalStack) -> None:
    log = stack.target.log_path
    assert log is not None
    text = log.read_text()
    assert "warmed up in" in text
    assert text.index("warmed up in") < text.index("target serving")
