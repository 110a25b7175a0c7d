"""Structured output's unmasked bursts, the router's bookkeeping (router/grammar_bursts.py), on
the default model's tokenizer: a burst is kept up to the first token the format refuses, a cut
owes a masked step and shortens the next burst, a whole burst doubles it; only greedy requests
without logprobs burst. Through the stack: tests/test_e2e_multi_step.py."""

from __future__ import annotations

import json

import pytest

from model_runtime.loading import default_model_path
from protos import generation_pb2 as pb
from router.grammar_bursts import GrammarBursts
from router.multi_step import MultiStep
from router.request import Request, SamplingOptions
from router.structured_output import compile_format
from router.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_model_path(str(default_model_path()))


def request(tokenizer: Tokenizer, **options: float | bool) -> Request:
    sampling = SamplingOptions(max_new_tokens=64, **{"temperature": 0.0, **options})
    req = Request("r", [1, 2, 3], sampling)
    spec = pb.StructuredOutput(json_schema=json.dumps(SCHEMA))
    req.constraint = compile_format(spec, tokenizer)
    return req


def test_a_burst_is_cut_at_the_first_refused_token(tokenizer: Tokenizer) -> None:
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    bursts, req = GrammarBursts(enabled=True), request(tokenizer)
    assert bursts.takes(req)
    opening = enc('{"a": ')
    assert bursts.keep(req, opening) == opening  # all allowed: kept, the next burst twice as long
    assert (req.burst_cap, req.masked_next) == (2 * len(opening), False)
    req.constraint.advance(opening)  # what the commit does with the kept tokens
    digits, wrong = enc("12"), enc("x, ")
    assert bursts.keep(req, digits + wrong) == digits
    assert req.masked_next and req.burst_cap == max(2, len(digits))
    assert not bursts.takes(req), "a cut owes one masked step"
    bursts.masked_step(req)
    assert bursts.takes(req)
    assert (bursts.num_bursts, bursts.num_cut) == (2, 1)


def test_an_eos_is_kept_only_where_the_format_may_end(tokenizer: Tokenizer) -> None:
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    eos = tokenizer.eos_token_ids[0]
    bursts, req = GrammarBursts(enabled=True), request(tokenizer)
    assert bursts.keep(req, [*enc('{"a": 1'), eos]) == enc('{"a": 1')
    req = request(tokenizer)
    whole = [*enc('{"a": 1}'), eos]
    assert bursts.keep(req, whole) == whole


def test_a_split_the_mask_refuses_is_cut(tokenizer: Tokenizer) -> None:
    """Where a forced text goes on ("convert" after "con"), llguidance's mask allows only its
    canonical token ("vert"), while its validate_tokens also takes "ver" + "t"; a masked draw
    sees the mask, so a burst must too (the H200's and the CPU's tool calls differed before).
    """
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    spec = pb.StructuredOutput(regex="convert_currency")
    split, canonical = [enc("ver")[0], enc("t")[0]], enc("vert")
    assert len(canonical) == 1 and tokenizer.decode(split) == "vert"
    for burst, kept in ((split, []), (canonical, canonical)):
        req = request(tokenizer)
        req.constraint = compile_format(spec, tokenizer)
        req.constraint.advance(enc("con"))
        assert GrammarBursts(enabled=True).keep(req, burst) == kept
        assert req.constraint.allowed_prefix(canonical) == 1, "the check left its trace"


@pytest.mark.parametrize(
    ("options", "enabled"),
    [({"temperature": 0.7}, True), ({"logprobs": True}, True), ({}, False)],
    ids=["sampled", "logprobs", "--grammar-bursts off"],
)
def test_only_greedy_requests_without_logprobs_burst(
    tokenizer: Tokenizer, options: dict, enabled: bool
) -> None:
    assert not GrammarBursts(enabled).takes(request(tokenizer, **options))
    assert MultiStep(8, grammar_bursts=enabled).changes_logits(request(tokenizer, **options))


def test_a_greedy_constrained_request_runs_multi_step_but_for_the_masked_step_a_cut_owes(
    tokenizer: Tokenizer,
) -> None:
    multi_step, req = MultiStep(8), request(tokenizer)
    assert not multi_step.changes_logits(req)
    req.masked_next = True
    assert multi_step.changes_logits(req)
