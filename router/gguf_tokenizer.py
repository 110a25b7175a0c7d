"""A byte-level BPE `tokenizers.Tokenizer` built from the tokenizer metadata of a GGUF file.

Uses only `tokenizers` and the file's header (router/gguf_metadata.py), so the router never
imports torch (nor numpy). It rebuilds the
tokenizer the way transformers does for `tokenizer.ggml.model == "gpt2"` (vocabulary respelled
into the byte alphabet, the file's merges, CONTROL tokens as special added tokens, USER_DEFINED
tokens as plain added tokens), so the ids it produces are the ids HF produces for the same file.
"""

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from router.gguf_metadata import read_gguf_metadata

# llama.cpp pre-tokenizer names whose split is GPT-2's regex, i.e. what ByteLevel(use_regex=True)
# applies. Others (llama3, qwen2, ...) need their own split regex, which we do not carry yet.
_GPT2_SPLIT_PRE_TOKENIZERS = frozenset({"default", "gpt-2", "gpt2", "smollm"})


class TokenType(IntEnum):
    """GGUF's tokenizer.ggml.token_type values (llama.cpp's llama_token_type)."""

    NORMAL = 1
    CONTROL = 3
    USER_DEFINED = 4


@dataclass(frozen=True)
class GGUFTokenizer:
    """What the router needs from a GGUF file's tokenizer metadata.

    `backend` adds BOS on `encode(..., add_special_tokens=True)` iff the file's
    `tokenizer.ggml.add_bos_token` is true; ids of `backend` equal the file's token indices.
    """

    backend: BackendTokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None
    model_name: str | None


def load_gguf_tokenizer(path: str) -> GGUFTokenizer:
    """Read the tokenizer metadata of the GGUF file at `path`; raises ValueError if unsupported."""
    fields = read_gguf_metadata(path)
    _check_supported(fields, path)
    tokens = _string_list(fields, "tokenizer.ggml.tokens")
    token_types = fields.get("tokenizer.ggml.token_type", [int(TokenType.NORMAL)] * len(tokens))
    backend = _build_backend(tokens, token_types, _string_list(fields, "tokenizer.ggml.merges"))
    bos_id = _int(fields, "tokenizer.ggml.bos_token_id")
    if _bool(fields, "tokenizer.ggml.add_bos_token") and bos_id is not None:
        backend.post_processor = _bos_processor(tokens[bos_id], bos_id)
    return GGUFTokenizer(
        backend=backend,
        bos_token_id=bos_id,
        eos_token_id=_int(fields, "tokenizer.ggml.eos_token_id"),
        chat_template=_str(fields, "tokenizer.chat_template"),
        model_name=_str(fields, "general.name"),
    )


def _check_supported(fields: dict[str, Any], path: str) -> None:
    model_type = _str(fields, "tokenizer.ggml.model")
    pre_type = _str(fields, "tokenizer.ggml.pre") or "default"
    if model_type != "gpt2" or pre_type not in _GPT2_SPLIT_PRE_TOKENIZERS:
        raise ValueError(
            f"{path}: unsupported GGUF tokenizer model={model_type!r} pre={pre_type!r}; "
            f"supported: model 'gpt2' with pre in {sorted(_GPT2_SPLIT_PRE_TOKENIZERS)}"
        )


def _build_backend(
    tokens: list[str], token_types: list[int], merges: list[str]
) -> BackendTokenizer:
    to_alphabet = byte_level_alphabet()
    alphabet = frozenset(to_alphabet.values())
    # Tokens outside the byte alphabet are stored as plain text; BPE looks them up byte-spelled.
    vocab = {
        t if set(t) <= alphabet else "".join(to_alphabet[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    pairs = [_split_merge(m) for m in merges]
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    # A CONTROL token spelled outside the byte alphabet is a llama.cpp mislabel; transformers skips
    # it (adding it would grow the vocabulary), and so must we to keep ids identical.
    control = [
        AddedToken(t, normalized=False, special=True)
        for t, kind in zip(tokens, token_types, strict=True)
        if kind == TokenType.CONTROL and set(t) <= alphabet
    ]
    backend.add_special_tokens(control)
    user_defined = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, token_types, strict=True)
        if kind == TokenType.USER_DEFINED and t in vocab
    ]
    backend.add_tokens(user_defined)
    return backend


def _bos_processor(bos_token: str, bos_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=f"{bos_token}:0 $A:0",
        pair=f"{bos_token}:0 $A:0 {bos_token}:1 $B:1",
        special_tokens=[(bos_token, bos_id)],
    )


def _split_merge(merge: str) -> tuple[str, str]:
    left, right = merge.split(" ")
    return left, right


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet ByteLevel spells bytes in)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    table = {b: chr(b) for b in printable}
    unprintable = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(unprintable)})
    return table


def _str(fields: dict[str, Any], key: str) -> str | None:
    value = fields.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"GGUF field {key} is {type(value).__name__}, expected a string")
    return value


def _int(fields: dict[str, Any], key: str) -> int | None:
    value = fields.get(key)
    return None if value is None else int(value)


def _bool(fields: dict[str, Any], key: str) -> bool:
    return bool(fields.get(key, False))


def _string_list(fields: dict[str, Any], key: str) -> list[str]:
    value = fields[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"GGUF field {key} is not an array of strings")
    return value
