"""Structured output, the router's side: each constrained request's grammar state, and the
allowed-token masks it sends the target (target_service/token_masks.py applies them).

A format (JSON Schema, any JSON object, a regular expression, a Lark or GBNF grammar, a
choice of strings) compiles to an llguidance matcher once, off the router's event loop, and
each request with that format gets a copy (router/format_cache.py); a bad one is refused with
llguidance's own message. The request's matcher then follows its committed tokens: every
position the target samples gets the mask of the tokens the grammar allows there, and a draft
tree is cut to the nodes the grammar allows, grown by the tokens it forces, and given one mask
per node (router/grammar_tree.py), so a verified position is masked exactly as sequential
decoding would mask it.

JSON keeps llguidance's defaults (whitespace between tokens is free; a schema's
``x-guidance`` object may set ``whitespace_flexible``, ``item_separator`` and
``key_separator``), so where the model's own reply is valid JSON the mask changes nothing:
the default model writes indented JSON, and forced compact it left its own distribution
(docs/api.md, "Structured output").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import lru_cache

import llguidance

from protos import generation_pb2
from router.errors import InvalidRequest
from router.grammar_tree import GrammarTree, allows
from router.json_text import parse_json
from router.request import SamplingOptions
from router.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_CHOICES = 256


def compile_format(
    spec: generation_pb2.StructuredOutput, tokenizer: Tokenizer
) -> Constraint | None:
    """The format's grammar state at the completion's start, compiled against the model's
    vocabulary (a bad format: InvalidRequest with llguidance's reason); None when unset.
    The router compiles through router/format_cache.py, which keeps what it compiled."""
    compiled = compile_spec(spec, tokenizer)
    return None if compiled is None else compiled.constraint()


def compile_spec(
    spec: generation_pb2.StructuredOutput, tokenizer: Tokenizer
) -> CompiledFormat | None:
    """The format compiled once, or the reason it does not compile; None when unset."""
    kind = spec.WhichOneof("format")
    if kind is None:
        return None
    try:
        grammar = _grammar(spec, kind)
    except ValueError as err:
        return CompiledFormat(kind, None, str(err), tokenizer)
    # A grammar that does not compile leaves the matcher in its error state (no raise).
    matcher = llguidance.LLMatcher(_ll_tokenizer(tokenizer), grammar, log_level=0)
    error = matcher.get_error() if matcher.is_error() else ""
    return CompiledFormat(kind, None if error else matcher, error, tokenizer)


class CompiledFormat:
    """A compiled format (its matcher at the completion's start), or why it did not compile."""

    def __init__(
        self, kind: str, matcher: llguidance.LLMatcher | None, error: str, tokenizer: Tokenizer
    ) -> None:
        self.kind = kind  # the StructuredOutput field it came from
        self.error = error
        self._matcher = matcher
        self._words = (tokenizer.vocab_size + 31) // 32
        self._eos = frozenset(tokenizer.eos_token_ids)

    def constraint(self) -> Constraint:
        """A request's own grammar state (a copy: 4-25 us, where compiling took 0.3-9 ms on
        the dev box), or InvalidRequest with the reason the format did not compile."""
        if self._matcher is None:
            raise InvalidRequest(
                f"structured_output.{self.kind}: {self.error}", "structured_output"
            )
        return Constraint(self.kind, self._matcher.deep_copy(), self._words, self._eos)


def refuse_with_ignore_eos(
    sampling: generation_pb2.SamplingParams, options: SamplingOptions
) -> None:
    if options.ignore_eos and sampling.structured_output.WhichOneof("format"):
        raise InvalidRequest(
            "structured_output cannot be combined with ignore_eos: a format ends at EOS",
            "structured_output",
        )


def _grammar(spec: generation_pb2.StructuredOutput, kind: str) -> str:
    matcher = llguidance.LLMatcher
    if kind == "json_schema":
        return matcher.grammar_from_json_schema(_schema_object(spec.json_schema))
    if kind == "json_object":
        if not spec.json_object:
            raise ValueError("set it to true, or leave the format unset")
        return matcher.grammar_from_json_schema({"type": "object"})
    if kind == "regex":
        return matcher.grammar_from_regex(spec.regex)
    if kind == "grammar":
        return llguidance.grammar_from("grammar", spec.grammar)  # Lark, else GBNF
    values = list(spec.choice.values)
    if not values or len(values) > MAX_CHOICES or not all(values):
        raise ValueError(f"needs 1 to {MAX_CHOICES} non-empty strings, got {len(values)}")
    return llguidance.grammar_from("choice", json.dumps(values))


def _schema_object(text: str) -> dict:
    try:
        schema = parse_json(text)
    except ValueError as err:
        raise ValueError(f"not JSON: {err}") from err
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON Schema is an object, got {type(schema).__name__}")
    return schema


@lru_cache(maxsize=4)
def _ll_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of the router's tokenizer: every id's bytes, the special ids, EOS
    (built once per tokenizer: 0.18 s for SmolLM2's 49,152 tokens on the dev box)."""
    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Vocabulary(tokenizer)),
        n_vocab=tokenizer.vocab_size,
        eos_token=list(tokenizer.eos_token_ids),
    )


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads off a tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = tokenizer.special_token_ids()

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tokenizer.encode(text, add_special_tokens=False)


class Constraint:
    """One request's grammar state, following its committed tokens."""

    def __init__(
        self, kind: str, matcher: llguidance.LLMatcher, words: int, eos: frozenset[int]
    ) -> None:
        self.kind = kind  # the StructuredOutput field it came from
        self._matcher = matcher
        self._words = words  # 32-bit words a mask takes
        self._eos = eos

    def mask(self) -> bytes:
        """The tokens allowed next, as ForwardItem.allowed_tokens."""
        return self._matcher.compute_bitmask()[: 4 * self._words]

    def advance(self, token_ids: Sequence[int]) -> None:
        """Follows committed tokens (each one the target drew under this state's mask)."""
        if token_ids and not self._matcher.consume_tokens(list(token_ids)):
            # The target masks every drawn token, so this means a bug; say so loudly.
            log.error("structured output: committed tokens %s broke the grammar: %s",
                      list(token_ids), self._matcher.get_error())  # fmt: skip

    def allowed_prefix(self, token_ids: Sequence[int]) -> int:
        """How many of ``token_ids``, from the first, each position's mask allows in turn from
        here (an EOS where the format may end); the state is left as it was. Masks, not
        llguidance's validate_tokens: where the format forces a text, the mask allows only its
        canonical tokens, while validate_tokens takes any split of it (after "con" of a forced
        "convert", "ver" as well as "vert"), and a masked draw sees the mask."""
        count = 0
        for token in token_ids:
            if not allows(self.mask(), token) or not self._matcher.consume_token(token):
                break
            count += 1
        if count:
            self._matcher.rollback(count)
        return count

    def only_eos_next(self) -> int | None:
        """The EOS id where the format allows that one token next and nothing else, else None
        (an is_accepting call mostly; the mask only where the format may end)."""
        if not self._matcher.is_accepting():
            return None
        allowed = int.from_bytes(self.mask(), "little")  # bit t: token t (ForwardItem's layout)
        token = allowed.bit_length() - 1
        return token if allowed.bit_count() == 1 and token in self._eos else None

    def forces_at_least(self, count: int) -> bool:
        """Whether the format forces ``count`` tokens or more next, EOS aside (1-61 us on the
        dev box)."""
        forced = self._matcher.compute_ff_tokens()
        return len(forced) >= count and not self._eos.intersection(forced[:count])

    def live_tree(
        self, tokens: Sequence[int], parents: Sequence[int], grow_to: int = 0
    ) -> tuple[list[int], list[int], bytes, int]:
        """A draft tree rooted at the last committed token, cut to the nodes the target could
        accept and grown by the tokens the grammar forces up to ``grow_to`` nodes (0: not
        grown), with their masks node-major (VerifyItem.allowed_tokens), and how many nodes
        the grammar forced. router/grammar_tree.py says how."""
        tree = GrammarTree(self._matcher, self.mask, self._eos, tokens, parents)
        return (*tree.live(grow_to), tree.num_forced)
