"""`splitspec train-draft` and `eval-draft` given an input that is not there (a --model, a
--head, a --prompts bundle, --data-dir) say so in one line and exit 2, as the services do;
they printed the loader's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitspec import cli

HEAD = Path(__file__).resolve().parents[1] / "draft_service" / "eagle" / "heads" / "smollm2-135m"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["eval-draft", "--head", "{tmp}/nohead"], "error: --head {tmp}/nohead: no such file"),
        (["eval-draft", "--head", "{tmp}"], "error: EAGLE head {tmp}: no eagle_config.json there"),
        (["eval-draft", "--head", str(HEAD), "--model", "{tmp}/no.gguf"],
         "error: model {tmp}/no.gguf: no such file or folder"),
        (["eval-draft", "--head", str(HEAD), "--prompts", "{tmp}/p.json"],
         "error: --prompts {tmp}/p.json: no such file or folder"),
        (["train-draft", "--model", "{tmp}/no.gguf"],
         "error: model {tmp}/no.gguf: no such file or folder"),
        (["train-draft", "--data-dir", "{tmp}/shards"],
         "error: --data-dir {tmp}/shards: no such file or folder"),
    ],
)  # fmt: skip
def test_a_missing_input_is_one_line_and_exit_2(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = [a.format(tmp=tmp_path) for a in argv]
    assert cli.main([*args, "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(said.format(tmp=tmp_path)) and "\n" not in err, err
