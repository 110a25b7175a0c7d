"""Speculation.tree_limit, on the default model's tokenizer: a constrained request's verified
tree may grow by its format's forced tokens (router/grammar_tree.py) to the tree limit or its
last token, and its slots are reserved for that many (router/retraction.py); an unconstrained
one's, or one with forced drafts off, is its drafted tree's size."""

from __future__ import annotations

import json

import pytest

from model_runtime.loading import default_model_path
from protos import generation_pb2 as pb
from router.request import Request, SamplingOptions
from router.speculation import Speculation
from router.structured_output import compile_format
from router.tokenizer import Tokenizer

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}})


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def decoding(tokenizer: Tokenizer, forced_drafts: bool = True, constrained: bool = True) -> Request:
    constraint = compile_format(pb.StructuredOutput(json_schema=SCHEMA), tokenizer)
    req = Request("r", [1, 2, 3], SamplingOptions(max_new_tokens=64), forced_drafts=forced_drafts,
                  constraint=constraint if constrained else None)  # fmt: skip
    req.output_ids, req.num_computed = [4], 3
    return req


def test_the_tree_limit_leaves_room_to_grow(tokenizer: Tokenizer) -> None:
    spec = Speculation(
        None, None, None,  # type: ignore[arg-type]  (tree_limit reads none of them)
        default_on=True, max_tree_tokens=16, vocab_size=tokenizer.vocab_size, max_context=100,
        max_verify_tokens=256,
    )  # fmt: skip
    grows, off = decoding(tokenizer), decoding(tokenizer, forced_drafts=False)
    free = decoding(tokenizer, constrained=False)
    assert spec.tree_limit(grows, 1, 256) == 16  # a one-node tree may grow to the limit
    assert spec.tree_limit(grows, 1, 8) == 8  # within its share of the Verify
    assert spec.tree_limit(off, 1, 256) == spec.tree_limit(free, 1, 256) == 1
    assert spec.tree_limit(free, 40, 256) == 16
    grows.output_ids = [4] * 60  # 4 tokens left of 64: the slots reserved end there
    assert spec.tree_limit(grows, 1, 256) == 4
    assert spec.tree_limit(grows, 12, 256) == 12  # a drafted tree's own size stands
    grows.output_ids, grows.num_computed = [4], 95
    assert spec.tree_limit(grows, 1, 256) == 5  # and the context's end
