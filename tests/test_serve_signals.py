"""`splitspec serve` stopped by SIGTERM (a `kill`, `docker stop`, systemd) or SIGINT (Ctrl-C)
stops every service it started, in order, before it exits 0. Real processes, the tests' tiny
model."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.processes import serve_until_serving, started_by
from tests.helpers.tiny_llama import tiny_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_stops_every_service_first(
    tmp_path: Path, tiny_model_dir: Path, stop: signal.Signals
) -> None:
    out_path = tmp_path / "serve.out"
    flags = ["--model", str(tiny_model_dir), "--port", "0", "--draft-method", "ngram"]
    serve = serve_until_serving(flags, out_path)
    try:
        assert len(started_by(serve.pid)) == 3  # router, target, draft replica
        serve.send_signal(stop)
        code = serve.wait(60)
        left = started_by(serve.pid)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert code == 0, out_path.read_text()[-3000:]
    assert not left, f"services outlived serve: {left}"
