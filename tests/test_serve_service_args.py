"""`splitspec serve --target-args/--router-args/--draft-args`: each service's own flags reach
it after serve's, and a wrong one is a usage error naming it before anything starts (the
flags serve sets itself, the stack's addresses, TLS, or what the service's parser refuses)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from splitspec.serve_cli import _local_stack
from splitspec.serve_flags import add_serve_flags
from splitspec.service_args import service_args
from tests.helpers.processes import serve_until_serving
from tests.helpers.tiny_llama import tiny_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    ("kind", "text", "said"),
    [
        ("target", "--attention torch --bogus", "--target-args: unrecognized arguments: --bogus"),
        ("target", "--attent torch", "unrecognized arguments: --attent torch"),
        ("target", "--max-context -3", "argument --max-context: must be >= 1, got -3"),
        ("target", "--num-slots 4", "--num-slots is set by serve: give serve's own --num-slots"),
        ("draft", "--method=ngram", "--method is set by serve: give serve's own --draft-method"),
        ("router", "--port 5", "--port is serve's to set"),
        ("router", "--draft 127.0.0.1:1", "--draft is serve's to set"),
        ("router", "--tls-cert c.pem", "--tls-cert is not for serve"),
        ("router", "--api-key-env K", "--api-key-env is not for serve"),
        ("router", "--max-queue '64", "--router-args: No closing quotation"),
    ],
)  # fmt: skip
def test_a_wrong_flag_is_refused_naming_it(kind: str, text: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        service_args(kind, text)


def test_flags_a_service_takes_come_back_split() -> None:
    assert service_args("target", "--attention torch --max-context 512") == [
        "--attention", "torch", "--max-context", "512"
    ]  # fmt: skip
    assert service_args("router", "--served-model-name 'my model'") == [
        "--served-model-name", "my model"
    ]  # fmt: skip
    assert service_args("draft", "") == []


def test_each_kinds_flags_follow_serves_own() -> None:
    serve = argparse.ArgumentParser()
    add_serve_flags(serve)
    extra = {"target": ["--attention", "torch"], "router": ["--max-queue", "9"],
             "draft": ["--packed-weights", "float32"]}  # fmt: skip
    args = serve.parse_args(["--num-draft-replicas", "2"])
    stack = _local_stack(args, extra)  # built, not started
    if stack.log_dir is not None:
        shutil.rmtree(stack.log_dir)
    for service, kind in [(stack.target, "target"), (stack.router, "router"), *(
        (draft, "draft") for draft in stack.drafts
    )]:  # fmt: skip
        command = service.command
        start = command.index(extra[kind][0])
        assert command[start : start + 2] == extra[kind]
        assert "--log-format" in command[:start]  # serve's own flags first


def test_serve_passes_them_to_running_services(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A real serve on the tiny model: the router's model name and the target's context come
    from the pass-through flags, as its HTTP API reports them."""
    out_path = tmp_path / "serve.out"
    flags = ["--model", str(tiny_model_dir), "--port", "0", "--draft-method", "ngram",
             "--router-args", "--served-model-name tiny-passed",
             "--target-args", "--max-context 96"]  # fmt: skip
    serve = serve_until_serving(flags, out_path)
    try:
        http = re.search(r"HTTP, /metrics\): (http://\S+/v1)", out_path.read_text())
        assert http, out_path.read_text()
        with urllib.request.urlopen(f"{http.group(1)}/models", timeout=30) as reply:
            (model,) = json.load(reply)["data"]
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    assert (model["id"], model["max_model_len"]) == ("tiny-passed", 96)
