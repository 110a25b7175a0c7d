"""router/output.py's within_receive_limit: a long prompt's scores never make an item that a
gRPC client with the default 4 MiB receive limit refuses; concatenated, they are unchanged."""

from __future__ import annotations

import random

from protos import generation_pb2 as pb
from router.output import MAX_ITEM_BYTES, within_receive_limit

CLIENT_DEFAULT_LIMIT = 4 << 20
TOP = 20


def entry(rng: random.Random) -> pb.LogprobEntry:
    """Shaped as the router spells them: ids, log-probabilities, text and bytes of varied
    length (a long whitespace or code token has many)."""

    def token() -> pb.TokenLogprob:
        text = "x" * rng.choice([1, 3, 6, 16, 48])
        return pb.TokenLogprob(token_id=rng.randrange(49152), logprob=-rng.random() * 20,
                               token=text, token_bytes=text.encode())  # fmt: skip

    return pb.LogprobEntry(chosen=token(), top=[token() for _ in range(TOP)])


def first_item(num_scores: int) -> pb.GenerateResponse:
    rng = random.Random(num_scores)
    return pb.GenerateResponse(
        request_id="r", token_ids=[5, 6], text="ab", logprobs=[entry(rng), entry(rng)],
        prompt_logprobs=[entry(rng) for _ in range(num_scores)],
    )  # fmt: skip


def test_an_item_within_the_limit_goes_as_it_is() -> None:
    item = first_item(500)
    assert within_receive_limit(item) == [item]


def test_a_long_prompts_scores_go_ahead_in_items_a_client_takes() -> None:
    item = first_item(9000)
    original = pb.GenerateResponse()
    original.CopyFrom(item)
    assert original.ByteSize() > CLIENT_DEFAULT_LIMIT  # one item would be refused
    parts = within_receive_limit(item)
    assert len(parts) >= 3
    assert all(p.ByteSize() <= MAX_ITEM_BYTES for p in parts[:-1])
    assert all(p.ByteSize() < CLIENT_DEFAULT_LIMIT for p in parts)
    scores = [e for p in parts for e in p.prompt_logprobs]
    assert scores == list(original.prompt_logprobs)
    for lead in parts[:-1]:
        assert lead.request_id == "r" and not lead.token_ids and not lead.logprobs
        assert lead.finish_reason == pb.FINISH_REASON_UNSPECIFIED
    last = parts[-1]
    assert (list(last.token_ids), last.text, list(last.logprobs)) == (
        list(original.token_ids), original.text, list(original.logprobs)
    )  # fmt: skip
