"""The router's tokenizer: text <-> token ids and chat prompts, with no torch anywhere below it.

Loads from a GGUF file (metadata only) or a HF-style directory holding `tokenizer.json`, and
produces the same ids as transformers' tokenizer for the same files.
"""

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from router.chat_template import ChatTemplate
from router.gguf_tokenizer import byte_level_alphabet, load_gguf_tokenizer

# ByteLevel's spelling of each byte, back to the byte (GPT-2-style vocabularies spell tokens so).
_ALPHABET_BYTES = {char: byte for byte, char in byte_level_alphabet().items()}


class Tokenizer:
    """Text <-> ids for one model.

    Invariants: ids are in `[0, vocab_size)`; `encode` adds BOS only if the model's own settings
    say so (GGUF `add_bos_token`, or the post-processor of `tokenizer.json`); special-token
    strings in text encode as their special ids, as in transformers' default; `decode` skips
    nothing unless asked. Instances are immutable after construction and safe to share.
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        eos_token_ids: Sequence[int],
        bos_token_id: int | None,
        chat_template: str | None,
        model_name: str,
    ) -> None:
        self._backend = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.bos_token_id: int | None = bos_token_id
        self.chat_template: str | None = chat_template
        self.model_name: str = model_name
        self._template = (
            ChatTemplate(chat_template, self._special_token_strings())
            if chat_template is not None
            else None
        )

    @classmethod
    def from_model_path(cls, path: str) -> "Tokenizer":
        """Load from a .gguf file, a directory with one .gguf, or a dir with `tokenizer.json`."""
        p = Path(path)
        if p.is_file():
            return cls._from_gguf(p)
        if not p.is_dir():
            raise FileNotFoundError(f"no model at {path}")
        if (p / "tokenizer.json").is_file():
            return cls._from_hf_dir(p)
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(f"{path}: expected tokenizer.json or exactly one .gguf, found {ggufs}")
        return cls._from_gguf(ggufs[0])

    @classmethod
    def _from_gguf(cls, path: Path) -> "Tokenizer":
        if path.suffix != ".gguf":
            raise ValueError(f"{path}: not a .gguf file")
        info = load_gguf_tokenizer(os.fspath(path))
        return cls(
            info.backend,
            eos_token_ids=[] if info.eos_token_id is None else [info.eos_token_id],
            bos_token_id=info.bos_token_id,
            chat_template=info.chat_template,
            model_name=info.model_name or path.stem,
        )

    @classmethod
    def _from_hf_dir(cls, path: Path) -> "Tokenizer":
        backend = BackendTokenizer.from_file(os.fspath(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        eos_ids = [_token_id(backend, config.get("eos_token"))]
        eos_ids += _generation_eos_ids(path)
        return cls(
            backend,
            eos_token_ids=[i for i in eos_ids if i is not None],
            bos_token_id=_token_id(backend, config.get("bos_token")),
            chat_template=_hf_chat_template(path, config),
            model_name=path.name,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids for `text`; `add_special_tokens=False` suppresses BOS (for pre-rendered prompts)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text for `ids`; incomplete UTF-8 at either end decodes as U+FFFD."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Prompt ids for a chat (and the tools it may call), ending in the assistant header;
        ValueError on a bad chat.

        Never adds BOS on top of the rendered text: templates that want BOS write it themselves.
        """
        if self._template is None:
            raise ValueError(f"model {self.model_name!r} has no chat template")
        text = self._template.render(messages, add_generation_prompt=True, tools=tools)
        return self.encode(text, add_special_tokens=False)

    def is_valid_id(self, token_id: int) -> bool:
        """Whether `token_id` names a token of this vocabulary."""
        return 0 <= token_id < self.vocab_size

    def token_text(self, token_id: int) -> str | None:
        """The vocabulary's spelling of one id (byte-level form, not decoded), or None."""
        return self._backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one id stands for: its byte-level spelling read back, or where the
        vocabulary is not byte-level (or the id is special) the UTF-8 of its decoded text."""
        spelling = self.token_text(token_id) or ""
        if spelling and all(char in _ALPHABET_BYTES for char in spelling):
            return bytes(_ALPHABET_BYTES[char] for char in spelling)
        return self.decode([token_id]).encode()

    def special_token_ids(self) -> list[int]:
        """Ids of the vocabulary's special tokens (BOS, EOS, chat and other control tokens)."""
        added = self._backend.get_added_tokens_decoder()
        return sorted(i for i, token in added.items() if token.special)

    def _special_token_strings(self) -> dict[str, str]:
        named = {"bos_token": self.bos_token_id}
        if self.eos_token_ids:
            named["eos_token"] = self.eos_token_ids[0]
        spelled = {name: self.token_text(i) for name, i in named.items() if i is not None}
        return {name: text for name, text in spelled.items() if text is not None}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _token_id(backend: BackendTokenizer, token: str | dict[str, Any] | None) -> int | None:
    # tokenizer_config.json spells special tokens either as a string or as an AddedToken dict.
    text = token.get("content") if isinstance(token, dict) else token
    return backend.token_to_id(text) if isinstance(text, str) else None


def _generation_eos_ids(path: Path) -> list[int]:
    # Chat models often stop on several ids (e.g. <|im_end|> and <|endoftext|>); HF lists them here.
    eos = _read_json(path / "generation_config.json").get("eos_token_id")
    if isinstance(eos, int):
        return [eos]
    return [i for i in eos if isinstance(i, int)] if isinstance(eos, list) else []


def _hf_chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    # Newer HF repos keep the template in its own file; older ones inline it, sometimes as a list
    # of named templates of which "default" is the one apply_chat_template uses.
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
