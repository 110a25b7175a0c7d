"""Structured output, the router's side (router/structured_output.py), on the default model's
tokenizer: formats compile or are refused with a reason, the masks follow committed text, and
a draft tree's masks are each node's sequential mask, with the matcher left as it was."""

from __future__ import annotations

import json

import pytest

from model_runtime.loading import default_model_path
from protos import generation_pb2 as pb
from router.errors import InvalidRequest
from router.grammar_tree import allows
from router.request import SamplingOptions
from router.structured_output import Constraint, compile_format, refuse_with_ignore_eos
from router.tokenizer import Tokenizer

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def constraint(tokenizer: Tokenizer, **spec) -> Constraint:
    c = compile_format(pb.StructuredOutput(**spec), tokenizer)
    assert c is not None
    return c


def allowed(mask: bytes, vocab: int) -> list[int]:
    return [t for t in range(vocab) if allows(mask, t)]


def test_a_choice_allows_its_strings_then_only_eos(tokenizer: Tokenizer) -> None:
    c = constraint(tokenizer, choice=pb.Choices(values=["yes", "no"]))
    first = allowed(c.mask(), tokenizer.vocab_size)
    assert {tokenizer.decode([t]) for t in first} <= {"y", "ye", "yes", "n", "no"}
    c.advance(tokenizer.encode("yes", add_special_tokens=False))
    assert allowed(c.mask(), tokenizer.vocab_size) == list(tokenizer.eos_token_ids)


COMPACT, INDENTED = '{"name": "Ada", "age": 36}', '{\n  "name": "Ada",\n  "age": 36\n}'


@pytest.mark.parametrize("text", [COMPACT, INDENTED])
def test_json_follows_the_schema_in_any_layout(tokenizer: Tokenizer, text: str) -> None:
    c = constraint(tokenizer, json_schema=SCHEMA)
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert allows(c.mask(), token), tokenizer.decode([token])
        c.advance([token])
    assert allowed(c.mask(), tokenizer.vocab_size) == list(tokenizer.eos_token_ids)
    wrong = constraint(tokenizer, json_schema=SCHEMA)
    wrong.advance(tokenizer.encode('{"name": "Ada", "age": ', add_special_tokens=False))
    assert not allows(wrong.mask(), tokenizer.encode('"', add_special_tokens=False)[0])


def test_only_eos_next_where_the_format_can_only_end(tokenizer: Tokenizer) -> None:
    """The router commits that EOS itself (router/commit.py): only where nothing else is
    allowed, not where the format may end or go on."""
    c = constraint(tokenizer, json_schema=SCHEMA)
    c.advance(tokenizer.encode('{"name": "Ada", "age": 3', add_special_tokens=False))
    assert c.only_eos_next() is None  # more digits, or the closing brace
    c.advance(tokenizer.encode("6}", add_special_tokens=False))
    assert c.only_eos_next() == tokenizer.eos_token_ids[0]
    free = constraint(tokenizer, regex="[a-z]+")
    free.advance(tokenizer.encode("abc", add_special_tokens=False))
    assert free.only_eos_next() is None  # accepting, but more letters may follow


def test_live_tree_masks_are_the_sequential_masks(tokenizer: Tokenizer) -> None:
    """A tree of two JSON continuations, a forbidden token and an EOS inside a string: the
    live tree is the two chains, each node's mask what a fresh matcher gives after its path;
    the walk leaves no trace."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prefix = enc('{"name": "')
    a, b = enc('Ada", "age'), enc('Bob"')
    tokens = [prefix[-1], *a, *b, 1, tokenizer.eos_token_ids[0]]  # 1: <|im_start|>
    parents = [-1, *range(len(a))]  # a chain under the root
    parents += [0, *range(1 + len(a), len(a) + len(b))]  # a second chain under the root
    parents += [0, 0]  # a forbidden token and an EOS (inside a string), children of the root
    c = constraint(tokenizer, json_schema=SCHEMA)
    c.advance(prefix)
    before = c.mask()
    live, live_parents, masks, _ = c.live_tree(tokens, parents)
    assert live == tokens[: 1 + len(a) + len(b)] and live_parents == parents[: len(live)]
    width = len(before)
    assert len(masks) == width * len(live) and c.mask() == before
    for node, path in [(0, []), (len(a), a), (len(a) + len(b), b)]:
        fresh = constraint(tokenizer, json_schema=SCHEMA)
        fresh.advance(prefix + path)
        assert masks[node * width : (node + 1) * width] == fresh.mask(), node


def test_nothing_after_an_eos_is_kept(tokenizer: Tokenizer) -> None:
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    c = constraint(tokenizer, json_object=True)
    c.advance(enc('{"a": 1}'))
    eos = tokenizer.eos_token_ids[0]
    tokens, parents = [enc("}")[-1], enc(" ")[0], eos, 7], [-1, 0, 0, 2]
    live, live_parents, masks, _ = c.live_tree(tokens, parents)
    assert live == [tokens[0], eos] and live_parents == [-1, 0]
    assert masks == c.mask() * 2  # the EOS node's rows are a stand-in: the root's mask


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"json_schema": "{"}, "not JSON"),
        ({"json_schema": '{"a": ' * 5000 + "1" + "}" * 5000}, "not JSON: nested too deeply"),
        ({"json_schema": "[1]"}, "a JSON Schema is an object"),
        ({"json_schema": '{"type": "strin"}'}, "strin"),
        ({"regex": "(("}, "unclosed group"),
        ({"grammar": "start: foo"}, "unknown name"),
        ({"choice": pb.Choices(values=[])}, "needs 1 to 256"),
        ({"json_object": False}, "set it to true"),
    ],
)
def test_bad_formats_are_refused_with_the_reason(
    tokenizer: Tokenizer, spec: dict, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as err:
        compile_format(pb.StructuredOutput(**spec), tokenizer)
    assert str(err.value).startswith(f"structured_output.{next(iter(spec))}: ")


def test_gbnf_and_lark_both_compile(tokenizer: Tokenizer) -> None:
    for grammar in ('root ::= "a" | "b"', 'start: "a" | "b"'):
        c = constraint(tokenizer, grammar=grammar)
        assert {tokenizer.decode([t]) for t in allowed(c.mask(), tokenizer.vocab_size)} == {
            "a",
            "b",
        }


def test_ignore_eos_is_refused() -> None:
    sampling = pb.SamplingParams(structured_output=pb.StructuredOutput(json_object=True))
    options = SamplingOptions(max_new_tokens=8, ignore_eos=True)
    with pytest.raises(InvalidRequest, match="ignore_eos"):
        refuse_with_ignore_eos(sampling, options)
    refuse_with_ignore_eos(pb.SamplingParams(), options)  # no format: nothing to refuse
