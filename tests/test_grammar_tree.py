"""router/grammar_tree.py's forced tokens, on the default model's tokenizer: where the drafter's
tree runs out or the grammar drops it, the tokens the format forces hang under the live leaf,
each with its sequential mask, within the room the caller gives; the matcher is left as it
was. (Masks and dropped nodes without growth: tests/test_structured_output.py.)"""

from __future__ import annotations

import json

import pytest

from model_runtime.loading import default_model_path
from protos import generation_pb2 as pb
from router.structured_output import Constraint, compile_format
from router.tokenizer import Tokenizer

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)
CHOICE = pb.Choices(values=["positive review", "negative review"])


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def constraint(tokenizer: Tokenizer, committed: str = "", **spec) -> Constraint:
    c = compile_format(pb.StructuredOutput(**spec), tokenizer)
    assert c is not None
    c.advance(tokenizer.encode(committed, add_special_tokens=False))
    return c


def check_masks(
    tokenizer, masks: bytes, tokens: list[int], parents: list[int], committed: str, **spec
) -> None:
    """Each node's mask is a fresh matcher's after the committed text and the node's path."""
    width = len(masks) // len(tokens)
    for node in range(len(tokens)):
        path, at = [], node
        while at > 0:
            path.insert(0, tokens[at])
            at = parents[at]
        fresh = constraint(tokenizer, committed, **spec)
        fresh.advance(path)
        assert masks[node * width : (node + 1) * width] == fresh.mask(), node


def test_a_forced_key_takes_the_place_of_forbidden_drafts(tokenizer: Tokenizer) -> None:
    """After '{"' the schema forces 'name'; the drafter's 'Name' and 'title' are dropped and
    their room holds it, though the tree may not grow past its three nodes."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    c = constraint(tokenizer, '{"', json_schema=SCHEMA)
    before = c.mask()
    tokens = [enc('{"')[-1], enc("Name")[0], enc("title")[0]]
    live, parents, masks, forced = c.live_tree(tokens, [-1, 0, 0], grow_to=3)
    assert [tokenizer.decode([t]) for t in live] == ['{"', "name"] and parents == [-1, 0]
    assert forced == 1 and c.mask() == before
    check_masks(tokenizer, masks, live, parents, '{"', json_schema=SCHEMA)


def test_a_choice_is_written_out_once_its_start_is_drafted(tokenizer: Tokenizer) -> None:
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    c = constraint(tokenizer, choice=CHOICE)
    tokens, tree_parents = [enc("Review:")[-1], enc("pos")[0]], [-1, 0]
    live, parents, masks, forced = c.live_tree(tokens, tree_parents, grow_to=16)
    assert tokenizer.decode(live[1:]) == "positive review"  # no EOS: the request's to end
    assert parents == [-1, 0, 1, 2] and forced == 2
    check_masks(tokenizer, masks, live, parents, "", choice=CHOICE)
    capped = c.live_tree(tokens, tree_parents, grow_to=3)
    assert tokenizer.decode(capped[0][1:]) == "positive" and capped[3] == 1
    unchanged = c.live_tree(tokens, tree_parents, grow_to=0)  # 0: forced drafts off
    assert unchanged[:2] == (tokens, tree_parents) and unchanged[3] == 0


def test_a_leaf_with_live_children_is_not_grown(tokenizer: Tokenizer) -> None:
    """The drafter's own 'itive' under 'pos' is kept as it is; forced tokens go only under
    the live leaves ('itive' then gets ' review')."""
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    c = constraint(tokenizer, choice=CHOICE)
    pos, itive = enc("pos")[0], enc("itive")[0]
    assert tokenizer.decode([pos, itive]) == "positive"
    live, parents, _, forced = c.live_tree([0, pos, itive], [-1, 0, 1], grow_to=16)
    assert tokenizer.decode(live[1:]) == "positive review" and forced == 1
    assert parents == [-1, 0, 1, 2]
