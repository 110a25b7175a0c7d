"""Checks that a Generate stream is well-formed."""

from __future__ import annotations

from collections.abc import Sequence

from protos import generation_pb2 as pb
from router.tokenizer import Tokenizer
from tests.helpers.rpc import Stream


def assert_well_formed(
    stream: Stream,
    prompt_len: int,
    max_new_tokens: int,
    tokenizer: Tokenizer,
    eos_ids: Sequence[int] = (2,),
) -> None:
    """One request id; only the last item ends the stream and carries usage; the text is the
    decode of the ids (a trailing EOS has no text); usage counts what was streamed."""
    items, ids, final = stream.items, stream.token_ids, stream.final
    assert len({item.request_id for item in items}) == 1 and items[0].request_id
    assert all(it.finish_reason == pb.FINISH_REASON_UNSPECIFIED for it in items[:-1])
    assert all(not it.HasField("usage") for it in items[:-1]), "usage before the last item"
    assert final.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert final.usage.prompt_tokens == prompt_len
    assert final.usage.completion_tokens == len(ids)
    assert 1 <= len(ids) <= max_new_tokens
    eos_positions = [i for i, t in enumerate(ids) if t in eos_ids]
    if final.finish_reason == pb.FINISH_REASON_EOS:
        assert eos_positions == [len(ids) - 1], f"EOS finish but EOS at {eos_positions}"
    else:
        assert not eos_positions, f"EOS at {eos_positions} did not end the stream"
    if final.finish_reason == pb.FINISH_REASON_LENGTH:
        assert len(ids) == max_new_tokens
    text_ids = ids[:-1] if eos_positions else ids
    assert stream.text == tokenizer.decode(text_ids)
