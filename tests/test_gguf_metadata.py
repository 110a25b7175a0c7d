"""The router's GGUF header reader (struct only) reads what gguf's GGUFReader reads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from model_runtime.hf_gguf import memoized_gguf_reads
from model_runtime.loading import default_model_path
from router.gguf_metadata import read_gguf_metadata


def test_every_field_equals_gguf_readers() -> None:
    gguf = pytest.importorskip("gguf")
    path = str(default_model_path())
    ours = read_gguf_metadata(path)
    with memoized_gguf_reads():  # gguf's reader on a plain array view: the same fields, faster
        reader = gguf.GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.keys() == fields.keys()
    for key, field in fields.items():
        if len(field.data) > 1:  # an array: its length, and every 97th item (contents() of all
            # 150k items takes seconds; test_tokenizer.py checks the whole vocabulary via HF)
            assert len(ours[key]) == len(field.data), key
            picked = range(0, len(field.data), 97)
            assert [ours[key][i] for i in picked] == [field.contents(i) for i in picked], key
            continue
        value = field.contents()
        if isinstance(value, float):
            assert math.isclose(ours[key], value, rel_tol=1e-7), key
        else:
            assert ours[key] == value, key
    assert len(ours["tokenizer.ggml.tokens"]) == 49152


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf_metadata(str(bad))


def test_a_truncated_header_is_refused(tmp_path: Path) -> None:
    head = default_model_path().read_bytes()[:100_000]  # ends inside the vocabulary
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head)
    with pytest.raises(ValueError, match="truncated GGUF header|ends inside a string"):
        read_gguf_metadata(str(cut))
