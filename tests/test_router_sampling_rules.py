"""The router's side of min_p, repetition_penalty and min_tokens: validation (INVALID_ARGUMENT
naming the field), what it sends the target when it opens (and re-opens) a request, when
multi-step decoding steps aside, and stop strings held off until min_tokens."""

from __future__ import annotations

import pytest

from protos import generation_pb2 as pb
from protos import target_pb2
from router.errors import InvalidRequest
from router.forward_item import sampling_config
from router.multi_step import MultiStep
from router.output import OutputStream
from router.request import Request, SamplingOptions
from router.stop import StopMatcher
from router.validation import Limits, sampling_options
from tests.helpers.prompts import router_tokenizer

LIMITS = Limits(vocab_size=1000, max_context=200, max_new_tokens_limit=64,
                default_max_new_tokens=16)  # fmt: skip
EOS = 2


def options(**sampling) -> SamplingOptions:
    request = pb.GenerateRequest(sampling=pb.SamplingParams(**sampling))
    return sampling_options(request, 10, LIMITS, eos_token_ids=[EOS])


@pytest.mark.parametrize(
    ("sampling", "field"),
    [({"min_p": -0.1}, "min_p"), ({"min_p": 1.5}, "min_p"), ({"min_p": float("nan")}, "min_p"),
     ({"repetition_penalty": 0.0}, "repetition_penalty"),
     ({"repetition_penalty": -1.0}, "repetition_penalty"),
     ({"repetition_penalty": 2.5}, "repetition_penalty"),
     ({"min_tokens": 9, "max_new_tokens": 8}, "min_tokens"),
     ({"min_tokens": 17}, "min_tokens")],  # over the default max_new_tokens 16
)  # fmt: skip
def test_bad_values_name_their_field(sampling: dict, field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        options(**sampling)


def test_defaults_are_off_and_min_tokens_bans_eos_and_stop_ids() -> None:
    plain = options()
    assert (plain.min_p, plain.repetition_penalty, plain.min_tokens) == (0.0, 1.0, 0)
    assert plain.min_tokens_banned_ids == ()
    o = options(min_tokens=4, stop_token_ids=[7, EOS, 5], min_p=0.1, repetition_penalty=1.2)
    assert o.min_tokens_banned_ids == (EOS, 5, 7) and o.min_p == pytest.approx(0.1)
    ignoring = options(min_tokens=4, ignore_eos=True)
    assert ignoring.min_tokens_banned_ids == ()  # nothing to ban: nothing extra


def test_the_target_gets_the_context_and_what_min_tokens_still_owes() -> None:
    o = options(min_tokens=5, repetition_penalty=1.3, stop_token_ids=[9])
    req = Request("r", [11, 12, 13], o)
    first = sampling_config(req)
    assert list(first.repetition_context) == [11, 12, 13] and first.min_tokens == 5
    assert list(first.min_tokens_banned_ids) == [EOS, 9]
    assert first.repetition_penalty == pytest.approx(1.3)
    req.output_ids = [20, 21]  # re-opened after a retraction: its state starts afresh there
    again = sampling_config(req)
    assert list(again.repetition_context) == [11, 12, 13, 20, 21] and again.min_tokens == 3
    req.output_ids = [20, 21, 22, 23, 24]
    done = sampling_config(req)
    assert done.min_tokens == 0 and not done.min_tokens_banned_ids
    plain = sampling_config(Request("p", [1], options()))
    assert plain == target_pb2.SamplingConfig(
        temperature=1.0, top_p=1.0, seed=plain.seed, repetition_penalty=1.0
    )


def test_multi_step_waits_while_a_rule_changes_logits() -> None:
    changes_logits = MultiStep(8).changes_logits
    binding = Request("m", [1], options(min_tokens=2))
    assert changes_logits(binding)
    binding.output_ids = [5, 6]
    assert not changes_logits(binding)  # met: K steps again
    assert changes_logits(Request("r", [1], options(repetition_penalty=1.1)))
    assert not changes_logits(Request("p", [1], options(min_p=0.2)))  # min_p rides the graphs


def test_stop_strings_wait_for_min_tokens() -> None:
    tok = router_tokenizer()
    ids = tok.encode("one two three four five six", add_special_tokens=False)
    stop = " two"
    early = OutputStream(tok, SamplingOptions(max_new_tokens=20, stop=(stop,)))
    assert early.commit(ids).finish_reason == pb.FINISH_REASON_STOP
    late = OutputStream(tok, SamplingOptions(max_new_tokens=20, stop=(stop,), min_tokens=4))
    out = late.commit(ids)
    assert out.finish_reason == pb.FINISH_REASON_UNSPECIFIED and out.text.startswith("one two")
    matcher = StopMatcher(["ab"])
    assert matcher.push("xa", may_stop=False) == ("x", False, None)  # "a" held: it may complete
    assert matcher.push("b", may_stop=True) == ("", True, "ab")
