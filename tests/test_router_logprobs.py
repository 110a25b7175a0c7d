"""router/logprobs.py on the default model's tokenizer: entries spell each token (text and exact
bytes, a character split over tokens included), keep the kept prefix with its top lists, and a
target answer shorter than the block costs the block its logprobs, not the step."""

from __future__ import annotations

import logging

import pytest

from model_runtime.loading import default_model_path
from protos import target_pb2
from router.logprobs import LogprobSpeller
from router.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def answer(count: int, top: int) -> target_pb2.Logprobs:
    return target_pb2.Logprobs(
        token_logprobs=[-0.5 - j for j in range(count)],
        top_ids=[100 + k for _ in range(count) for k in range(top)],
        top_logprobs=[-0.1 - k for _ in range(count) for k in range(top)],
    )


def test_bytes_spell_the_text_even_across_a_split_character(tokenizer: Tokenizer) -> None:
    text = "naïve café 日本"
    ids = tokenizer.encode(text, add_special_tokens=False)
    entries = LogprobSpeller(tokenizer).entries(answer(len(ids), 0), ids)
    assert b"".join(e.chosen.token_bytes for e in entries).decode() == text
    assert [e.chosen.token_id for e in entries] == ids
    assert any("\ufffd" in e.chosen.token for e in entries)  # a character over two tokens


def test_a_kept_prefix_keeps_its_own_top_lists(tokenizer: Tokenizer) -> None:
    entries = LogprobSpeller(tokenizer).entries(answer(4, 3), [5, 6])  # a stop kept two of four
    assert [e.chosen.logprob for e in entries] == [-0.5, -1.5]
    assert [[t.token_id for t in e.top] for e in entries] == [[100, 101, 102]] * 2
    assert [t.logprob for t in entries[1].top] == pytest.approx([-0.1, -1.1, -2.1])


def test_too_short_an_answer_drops_the_blocks_logprobs_with_a_warning(
    tokenizer: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="splitspec.router"):
        assert LogprobSpeller(tokenizer).entries(answer(1, 0), [5, 6]) == []
    assert "sent 1 logprobs for 2 committed tokens" in caplog.text
