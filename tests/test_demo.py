"""The demo's verdict on its runs (splitspec/demo.py); the runs themselves are
tests/test_cold_start.py's first test, the README's command end to end."""

from __future__ import annotations

from splitspec.client import GenerationResult
from splitspec.demo import (
    COMPARISON_ORDER,
    ORDER_SAID,
    same_tokens,
    same_tokens_in_all,
    tokens_per_s,
)


def result(*token_ids: int, seconds: float = 0.0) -> GenerationResult:
    return GenerationResult(token_ids=list(token_ids), seconds=seconds)


def test_equal_runs_say_so_with_their_length() -> None:
    assert same_tokens(result(5, 6, 7), result(5, 6, 7)) == "the same 3 tokens"


def test_runs_that_differ_name_the_first_token_that_differs() -> None:
    verdict = same_tokens(result(5, 6, 7, 8), result(5, 6, 9, 8))
    assert verdict == "the tokens differ from token 2 on (4 against 4)"


def test_a_run_that_stops_early_differs_where_it_stops() -> None:
    verdict = same_tokens(result(5, 6), result(5, 6, 7))
    assert verdict == "the tokens differ from token 2 on (2 against 3)"


def test_every_run_that_differs_is_named_with_its_place() -> None:
    runs = [result(5, 6, 7), result(5, 6, 7), result(5, 9, 7), result(5, 6, 7)]
    assert same_tokens_in_all(runs) == "run 3: the tokens differ from token 1 on (3 against 3)"
    assert same_tokens_in_all(runs[:2]) == "the same 3 tokens in all 2 runs"


def test_an_arms_rate_is_its_tokens_over_its_seconds_not_a_mean_of_rates() -> None:
    # 10 tokens in 1 s with 10 in 4 s: 20 in 5 s, 4 tok/s (the mean of the rates says 6.25).
    assert tokens_per_s([result(*range(10), seconds=1.0), result(*range(30), seconds=1.0)]) == 20
    assert tokens_per_s([result(*range(10), seconds=1.0), result(*range(10), seconds=4.0)]) == 4
    assert tokens_per_s([]) == 0.0


def test_the_comparison_alternates_its_arms_abba() -> None:
    """A speed drift over the four runs (the verdict says "four") reaches both arms alike: each
    arm's runs sit at mirrored places (their mean place is the same)."""
    places = {arm: [i for i, a in enumerate(COMPARISON_ORDER) if a == arm] for arm in (True, False)}
    assert len(places[True]) == len(places[False]) == 2
    assert sum(places[True]) == sum(places[False])
    assert ORDER_SAID == "off, on, on, off"
