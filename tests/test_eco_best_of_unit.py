"""Completions' best_of without a stack: parsing (candidates fanned out as n choices, logprobs
asked of the target for ranking but hidden from a client that did not ask), the 400s naming
best_of, and the ranking on constructed candidates (mean logprob a token, best first)."""

from __future__ import annotations

import pytest

from protos import generation_pb2 as pb
from router.openai_api.best_of import mean_logprob, ranked
from router.openai_api.errors import ApiError
from router.openai_api.logprobs import LOGPROB_FLOOR
from router.openai_api.protocol import parse_chat, parse_completion, requests

CHAT = [{"role": "user", "content": "Hi"}]


def candidate(*logprobs: float) -> pb.GenerateResponse:
    whole = pb.GenerateResponse()
    for logprob in logprobs:
        whole.logprobs.add().chosen.logprob = logprob
    return whole


def test_candidates_fan_out_with_seed_plus_i_and_hidden_logprobs() -> None:
    parsed = parse_completion({"prompt": "a", "n": 2, "best_of": 4, "seed": 7})
    assert parsed.num_candidates == 4 and parsed.hidden_logprobs
    generates = requests(parsed)
    assert [g.sampling.seed for g in generates] == [7, 8, 9, 10]
    assert all(g.sampling.logprobs and g.sampling.top_logprobs == 0 for g in generates)


def test_a_client_asking_for_logprobs_keeps_its_top_k() -> None:
    parsed = parse_completion({"prompt": "a", "best_of": 3, "logprobs": 2, "echo": True})
    assert not parsed.hidden_logprobs
    assert all(g.sampling.top_logprobs == 2 and g.sampling.prompt_logprobs
               for g in requests(parsed))  # fmt: skip


def test_echo_does_not_score_the_prompt_for_ranking() -> None:
    parsed = parse_completion({"prompt": "a", "best_of": 2, "echo": True})
    assert parsed.hidden_logprobs and not parsed.generate.sampling.prompt_logprobs


@pytest.mark.parametrize("body", [{"n": 3}, {"n": 3, "best_of": 3}, {"best_of": 1},
                                  {"n": 2, "best_of": 2, "stream": True}])  # fmt: skip
def test_best_of_n_or_none_is_n_choices_unranked(body: dict) -> None:
    parsed = parse_completion({"prompt": ["a", "b"], **body})
    assert parsed.num_candidates == parsed.n and not parsed.hidden_logprobs
    assert len(requests(parsed)) == 2 * parsed.n
    assert not parsed.generate.sampling.logprobs


@pytest.mark.parametrize(
    "body",
    [{"best_of": 0}, {"best_of": 65}, {"best_of": "2"}, {"best_of": 1.5}, {"best_of": True},
     {"n": 3, "best_of": 2}, {"n": 2, "best_of": 3, "stream": True},
     {"prompt": ["a"] * 5, "best_of": 60}],
)  # fmt: skip
def test_bad_best_of_is_refused_naming_it(body: dict) -> None:
    with pytest.raises(ApiError) as err:
        parse_completion({"prompt": "a", **body})
    assert err.value.status == 400 and err.value.body()["error"]["param"] == "best_of"


def test_too_many_choices_still_name_n() -> None:
    with pytest.raises(ApiError) as err:
        parse_completion({"prompt": ["a"] * 5, "n": 60, "best_of": 60})
    assert err.value.body()["error"]["param"] == "n"


def test_chat_refuses_best_of_over_one() -> None:
    parse_chat({"messages": CHAT, "best_of": 1})
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": CHAT, "n": 2, "best_of": 2})
    assert err.value.status == 400 and err.value.body()["error"]["param"] == "best_of"


def test_mean_logprob_is_per_token_and_floored() -> None:
    assert mean_logprob(candidate(-1.0, -3.0)) == -2.0
    assert mean_logprob(candidate(float("-inf"), 0.0)) == LOGPROB_FLOOR / 2
    assert mean_logprob(candidate()) == 0.0


def test_ranked_picks_the_n_best_a_prompt_best_first() -> None:
    first = [candidate(-2.0), candidate(-0.5, -0.5, -0.5), candidate(-1.0), candidate(-0.1)]
    second = [candidate(-3.0), candidate(-1.0), candidate(-1.0), candidate(-2.0)]  # a tie
    wholes = first + second  # two prompts' candidates, as fanned out
    # Candidate 1's sum (-1.5) is lower than candidate 0's, its mean higher: means rank.
    assert ranked(wholes, n=2, best_of=4) == [3, 1, 5, 6]
    assert ranked(wholes, n=1, best_of=4) == [3, 5]
    assert ranked(wholes, n=4, best_of=4) == list(range(8))  # n choices keep their order
