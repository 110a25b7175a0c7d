"""draft_service.eagle.hot_vocab: which token ids a head may draft, chosen from counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draft_service.eagle.hot_vocab import coverage, hot_token_ids, main


def test_most_counted_ids_sorted_with_ties_to_the_lower_id() -> None:
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    assert hot_token_ids(counts, 3).tolist() == [0, 2, 5]  # 9, 9, then the first of the 5s


def test_always_kept_ids_are_added_without_growing_past_size() -> None:
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    assert hot_token_ids(counts, 3, always=[6]).tolist() == [2, 5, 6]
    assert hot_token_ids(counts, 1, always=[6, 1]).tolist() == [1, 6]  # forced beat size


def test_coverage_is_the_share_of_counted_tokens_inside() -> None:
    counts = torch.tensor([6, 0, 3, 1])
    assert coverage(counts, torch.tensor([0, 3])) == pytest.approx(0.7)


@pytest.mark.parametrize("size,always", [(0, []), (2, [99])])
def test_bad_requests_are_refused(size: int, always: list[int]) -> None:
    with pytest.raises(ValueError):
        hot_token_ids(torch.ones(8, dtype=torch.long), size, always)


def test_cli_writes_the_head_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts_file = tmp_path / "counts.safetensors"
    save_file({"counts": torch.tensor([1, 8, 3, 0, 4])}, counts_file)
    main(["--counts", str(counts_file), "--size", "2", "--head", str(tmp_path), "--always", "3"])
    written = load_file(tmp_path / "hot_vocab.safetensors")["token_ids"]
    assert written.tolist() == [1, 3]
    report = json.loads(capsys.readouterr().out)
    assert report["size"] == 2 and report["coverage"] == pytest.approx(0.5)
