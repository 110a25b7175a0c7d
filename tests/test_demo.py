"""The demo's verdict on its two runs (splitspec/demo.py); the runs themselves are
tests/test_cold_start.py's first test, the README's command end to end."""

from __future__ import annotations

from splitspec.client import GenerationResult
from splitspec.demo import same_tokens


def result(*token_ids: int) -> GenerationResult:
    return GenerationResult(token_ids=list(token_ids))


def test_equal_runs_say_so_with_their_length() -> None:
    assert same_tokens(result(5, 6, 7), result(5, 6, 7)) == "the same 3 tokens"


def test_runs_that_differ_name_the_first_token_that_differs() -> None:
    verdict = same_tokens(result(5, 6, 7, 8), result(5, 6, 9, 8))
    assert verdict == "the tokens differ from token 2 on (4 against 4)"


def test_a_run_that_stops_early_differs_where_it_stops() -> None:
    verdict = same_tokens(result(5, 6), result(5, 6, 7))
    assert verdict == "the tokens differ from token 2 on (2 against 3)"
