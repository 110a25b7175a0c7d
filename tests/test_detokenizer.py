"""router.detokenizer: streamed text equals the one-shot decode and never splits a character."""

import random

import pytest

from router.detokenizer import IncrementalDetokenizer
from router.tokenizer import Tokenizer
from tests.test_tokenizer import HANDMADE, model_path, sharegpt_strings

WIDE = [
    "😀😃😄😁🤣🥲🫠 family 👨‍👩‍👧‍👦 flags 🇯🇵🇫🇷",
    "中文分词测试：我们今天去公园散步，天气很好。",
    "日本語：東京は日本の首都です。カタカナ、ひらがな。",
    "한국어 문장입니다. 감사합니다!",
    "Ελληνικά και русский текст, עברית, العربية",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝛼𝛽𝛾 ⼀⼁⼂ and e\u0301 and \U0010ffff",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_model_path(model_path())


@pytest.fixture(scope="module")
def strings() -> list[str]:
    return WIDE + HANDMADE + sharegpt_strings(60, 40)


def stream(detok: IncrementalDetokenizer, ids: list[int], chunk_sizes: list[int]) -> list[str]:
    """Feed `ids` in chunks of the given sizes (cycled); return every piece incl. the flush."""
    pieces, pos, n = [], 0, 0
    while pos < len(ids):
        size = chunk_sizes[n % len(chunk_sizes)]
        pieces.append(detok.add(ids[pos : pos + size]))
        pos, n = pos + size, n + 1
    pieces.append(detok.flush())
    return pieces


def test_wide_strings_really_split_characters(tok: Tokenizer) -> None:
    # Guards the tests below: at least some tokens must decode to U+FFFD on their own.
    ids = tok.encode("".join(WIDE))
    assert any("\ufffd" in tok.decode([i]) for i in ids)


@pytest.mark.parametrize("chunk_sizes", [[1], [2], [3, 1, 4, 1, 5], [1000]])
def test_stream_equals_decode_without_replacement_chars(
    tok: Tokenizer, strings: list[str], chunk_sizes: list[int]
) -> None:
    for text in strings:
        ids = tok.encode(text)
        pieces = stream(IncrementalDetokenizer(tok), ids, chunk_sizes)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
        assert not any("\ufffd" in p for p in pieces), text[:60]


def test_special_tokens_kept_when_not_skipped(tok: Tokenizer) -> None:
    text = "<|im_start|>assistant\n猫 🐱<|im_end|>"
    ids = tok.encode(text)
    pieces = stream(IncrementalDetokenizer(tok, skip_special_tokens=False), ids, [1])
    assert "".join(pieces) == text


def test_random_chunking_of_random_ids(tok: Tokenizer) -> None:
    # Arbitrary ids may form invalid UTF-8; the concatenation must still equal decode(all).
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        sizes = [rng.randrange(1, 4) for _ in range(5)]
        pieces = stream(IncrementalDetokenizer(tok, skip_special_tokens=False), ids, sizes)
        assert "".join(pieces) == tok.decode(ids)


def test_split_character_is_held_then_released(tok: Tokenizer) -> None:
    ids = tok.encode("🐱")
    assert len(ids) > 1 and tok.decode(ids[:1]).endswith("\ufffd")
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.add(ids[1:]) == "🐱"
    assert detok.flush() == ""


def test_flush_releases_an_unfinished_character(tok: Tokenizer) -> None:
    ids = tok.encode("🐱")
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.flush() == tok.decode(ids[:1])


def test_decode_window_stays_small(tok: Tokenizer) -> None:
    # O(new tokens): after emitting, the re-decoded context is only the last emitted chunk.
    detok = IncrementalDetokenizer(tok)
    for i in tok.encode("word " * 500):
        detok.add([i])
        assert detok._read_offset - detok._prefix_offset <= 1
    assert detok.num_tokens == len(tok.encode("word " * 500))
