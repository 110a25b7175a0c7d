"""Streaming ids -> text that never emits half a character.

A byte-level token can end inside a multi-byte UTF-8 character (emoji, CJK), and decoding it
alone yields U+FFFD. We keep two offsets into the ids seen so far:

    ids[prefix_offset:read_offset]  already emitted; re-decoded only as context
    ids[read_offset:]               not yet emitted

and emit `decode(ids[prefix_offset:]) - decode(ids[prefix_offset:read_offset])` once it no longer
ends in U+FFFD. The decoded context is the last emitted chunk, so each `add` costs
O(new + held-back tokens), not O(all tokens). The context also keeps decoders that treat a
sequence's first token specially (e.g. stripping a leading space) from changing emitted text.
"""

from collections.abc import Sequence

from router.tokenizer import Tokenizer

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of ids into a stream of text pieces for one sequence.

    Invariant: the concatenation of everything `add` and `flush` return equals
    `tokenizer.decode(all_ids, skip_special_tokens)`, and no piece returned by `add` ends inside a
    character. Not thread-safe; one instance per sequence.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def num_tokens(self) -> int:
        """How many ids have been added so far."""
        return len(self._ids)

    def add(self, ids: Sequence[int]) -> str:
        """Append `ids` and return the text they complete (may be "" while a char is split)."""
        self._ids.extend(ids)
        prefix_text, new_text = self._decode_pending()
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR):
            return ""
        return self._advance(new_text[len(prefix_text) :])

    def add_each(self, ids: Sequence[int]) -> str:
        """What ``add([i])`` for each id in turn returns, joined (the same cuts, so the same
        held-back text at the end), without a call per id."""
        pieces = []
        for token in ids:
            self._ids.append(token)
            prefix_text, new_text = self._decode_pending()
            if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT_CHAR):
                pieces.append(self._advance(new_text[len(prefix_text) :]))
        return "".join(pieces)

    def flush(self) -> str:
        """Return whatever was held back, U+FFFD included; call once at the end of the stream."""
        prefix_text, new_text = self._decode_pending()
        if len(new_text) <= len(prefix_text):
            return ""
        return self._advance(new_text[len(prefix_text) :])

    def _decode_pending(self) -> tuple[str, str]:
        context = self._ids[self._prefix_offset : self._read_offset]
        pending = self._ids[self._prefix_offset :]
        return self._decode(context), self._decode(pending)

    def _advance(self, text: str) -> str:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
