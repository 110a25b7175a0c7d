"""benchmarks/run_record.py's save_run: a results file keeps its note and its other runs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.run_record import save_run


def test_a_run_replaces_its_label_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"note": "what the runs are", "runs": [{"label": "a", "x": 1}]}))
    save_run(path, "b", {"label": "b", "x": 2})
    save_run(path, "a", {"label": "a", "x": 3})
    saved = json.loads(path.read_text())
    assert saved["note"] == "what the runs are"
    assert saved["runs"] == [{"label": "b", "x": 2}, {"label": "a", "x": 3}]


def test_a_new_file_holds_the_run(tmp_path: Path) -> None:
    path = tmp_path / "new.json"
    save_run(path, "a", {"label": "a"})
    assert json.loads(path.read_text()) == {"runs": [{"label": "a"}]}
