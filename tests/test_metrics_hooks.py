"""router.telemetry's hooks without a stack: FanOut passes every hook to both observers (one it
missed would leave metrics or the request log blind to it), the compile histogram counts exactly
when worker threads observe it at once, and tool_choice's labels stay the four documented."""

from __future__ import annotations

import inspect
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import create_autospec

import pytest

from router.metrics import RouterMetrics
from router.openai_api.tools import parse_tools
from router.telemetry import FanOut, Observer

HOOKS = [name for name, value in vars(Observer).items()
         if inspect.isfunction(value) and not name.startswith("_")]  # fmt: skip
TOOL = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("hook", HOOKS)
def test_fan_out_passes_every_hook_to_both(hook: str) -> None:
    first, second = (create_autospec(Observer, instance=True) for _ in range(2))
    args = [object()] * (len(inspect.signature(getattr(Observer, hook)).parameters) - 1)
    getattr(FanOut(first, second), hook)(*args)
    getattr(first, hook).assert_called_once_with(*args)
    getattr(second, hook).assert_called_once_with(*args)


def test_compile_times_observed_from_threads_all_count() -> None:
    metrics = RouterMetrics("m")
    threads, each = 8, 500

    def observe(_: int) -> None:
        for _ in range(each):
            metrics.format_compiled("regex", 0.002)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(observe, range(threads)))
    labels = {"model_name": "m", "format": "regex"}
    count = metrics.registry.get_sample_value(
        "splitspec:structured_output_compile_seconds_count", labels
    )
    assert count == threads * each


@pytest.mark.parametrize(
    ("choice", "label"),
    [(None, "auto"), ("auto", "auto"), ("required", "required"), ("none", "none"),
     ({"type": "function", "function": {"name": "get_weather"}}, "named")],
)  # fmt: skip
def test_tool_choice_labels(choice: object, label: str) -> None:
    tools = parse_tools({"tools": [TOOL], "tool_choice": choice})
    assert tools is not None and tools.choice_label == label
