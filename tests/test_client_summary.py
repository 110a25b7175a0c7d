"""The client's summary line: acceptance says which part of a reply it covers."""

from __future__ import annotations

from protos import generation_pb2 as pb
from splitspec.client import acceptance_summary


def test_a_reply_that_speculated_throughout_has_no_target_only_tokens() -> None:
    stats = pb.SpeculationStats(
        verify_steps=10, draft_tokens=160, accepted_tokens=20, mean_acceptance_length=3.0
    )
    line = acceptance_summary(stats, num_tokens=30)
    assert line == "acceptance 3.00 tokens/step over 10 verify steps (20/160 drafts accepted)"


def test_tokens_outside_verify_steps_are_counted_as_target_only() -> None:
    """The switch turned speculation off after 24 rounds: 84 tokens, 37 of them verified."""
    stats = pb.SpeculationStats(
        verify_steps=24, draft_tokens=360, accepted_tokens=13, mean_acceptance_length=1.54
    )
    line = acceptance_summary(stats, num_tokens=84)
    assert line.endswith("(13/360 drafts accepted; 47 tokens from target-only steps)")
    assert line.startswith("acceptance 1.54 tokens/step over 24 verify steps")


def test_one_step_and_one_target_only_token_read_in_the_singular() -> None:
    stats = pb.SpeculationStats(
        verify_steps=1, draft_tokens=8, accepted_tokens=2, mean_acceptance_length=3.0
    )
    line = acceptance_summary(stats, num_tokens=4)
    assert line == (
        "acceptance 3.00 tokens/step over 1 verify step (2/8 drafts accepted; "
        "1 token from target-only steps)"
    )
