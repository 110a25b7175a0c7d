"""Logging (plumbing/logs.py): --log-format json makes every process's log one JSON object a
line, and the router's --log-requests adds a line per finished request keyed by its id; a real
stack (target, an n-gram replica, router) on the tiny model writes them."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plumbing.logs import JsonFormatter, add_log_flags
from splitspec.launcher import free_port
from tests.helpers.spec_fixtures import (  # noqa: F401 (fixtures)
    Router,
    ids_request,
    running_stack,
    tiny_model_dir_fixture,
)

pytestmark = pytest.mark.timeout(180)
JSON = ["--log-format", "json"]


def record(message: str, exc_info=None, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("splitspec.test", logging.WARNING, __file__, 1, message, (), exc_info)
    rec.__dict__.update(extra)
    return rec


def test_json_line_carries_the_request_id_and_exception() -> None:
    formatter = JsonFormatter("router")
    line = json.loads(formatter.format(record("slow %s", request_id="r-1")))
    assert line["message"] == "slow %s" and line["request_id"] == "r-1"
    assert (line["level"], line["service"]) == ("warning", "router")
    assert line["logger"] == "splitspec.test"
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record("failed", exc_info=sys.exc_info())
    assert "RuntimeError: boom" in json.loads(formatter.format(failed))["exception"]


def test_a_bad_log_format_variable_is_a_usage_error(monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPLITSPEC_LOG_FORMAT", "xml")
    parser = argparse.ArgumentParser()
    add_log_flags(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([])
    assert exit_info.value.code == 2
    assert "'xml' (from --log-format or $SPLITSPEC_LOG_FORMAT)" in capsys.readouterr().err
    assert parser.parse_args(["--log-format", "text"]).log_format == "text"


def test_a_stack_logs_json_and_a_line_per_request(tmp_path: Path, tiny_model_dir: Path) -> None:
    drafts = [["--method", "ngram", *JSON]]
    http_port = free_port()  # metrics on too: the request log is a second observer beside them
    router_args = [*JSON, "--log-requests", "--http-port", str(http_port)]
    prompt = [5, 6, 7, 8, 9] * 4  # repeats: the n-gram drafter proposes, so rounds verify
    with running_stack(tmp_path, tiny_model_dir, drafts, JSON, router_args) as (_, router):
        stream = router.generate(ids_request(prompt, 12, True, request_id="logged-1"))
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10)
        finished = [
            s.value
            for family in text_string_to_metric_families(metrics.read().decode())
            for s in family.samples
            if s.name == "splitspec:request_success_total"
        ]
    assert sum(finished) == 1, finished
    logs = {path.stem: path.read_text().splitlines() for path in tmp_path.glob("*.log")}
    assert {"target", "router"} <= set(logs) and len(logs) == 3, sorted(logs)
    lines = {name: [json.loads(text) for text in texts] for name, texts in logs.items()}
    for name, parsed in lines.items():
        assert parsed, f"{name} logged nothing"
        assert all({"time", "level", "service", "message"} <= set(p) for p in parsed), name
    finished = [p for p in lines["router"] if p["logger"] == "splitspec.requests"]
    assert len(finished) == 1, finished
    line = finished[0]
    assert line["request_id"] == "logged-1" and line["service"] == "router"
    assert line["completion_tokens"] == len(stream.token_ids) == 12
    assert line["prompt_tokens"] == len(prompt) and line["finish_reason"] == "length"
    assert 0 < line["ttft_ms"] <= line["total_ms"]
    assert line.get("verify_steps", 0) == stream.final.speculation.verify_steps


def test_json_logs_draw_no_progress_bars() -> None:
    """A bar's carriage returns on stderr would break a one-object-a-line log stream; the
    graph capture's bar (model_runtime/cuda_graphs.progress) asks progress_bars() first."""
    probe = (
        "from plumbing.logs import progress_bars, setup_logging\n"
        "from model_runtime.cuda_graphs import progress\n"
        "before = progress_bars(); setup_logging('target', 'info', '{fmt}')\n"
        "print(before, progress_bars(), progress([1], 'graphs').disable)\n"
    )
    for fmt, expected in (("json", "True False True"), ("text", "True True False")):
        out = subprocess.run([sys.executable, "-c", probe.format(fmt=fmt)], capture_output=True,
                             text=True, timeout=120, check=True).stdout.split()
        assert " ".join(out) == expected, (fmt, out)
