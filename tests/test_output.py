"""router/output.py: a committed block's kept ids, text and finish reason are those of the
stop rules applied token by token, with or without stop strings (the block path without them
must cut, word and hold back text exactly as the per-token path does)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from protos import generation_pb2 as pb
from router.output import Committed, OutputStream
from router.request import SamplingOptions
from router.tokenizer import Tokenizer
from tests.helpers.prompts import router_tokenizer
from tests.test_detokenizer import WIDE
from tests.test_tokenizer import HANDMADE


class PerToken(OutputStream):
    """The rules one token at a time, as ``commit`` applies them where stop strings are set."""

    def commit(self, token_ids: Sequence[int]) -> Committed:
        out = Committed([], "")
        for token in token_ids:
            out.token_ids.append(token)
            self.num_tokens += 1
            if self._stopped_by_token(token, out):
                out.text += self._flush()
                break
            out.text += self.stops.push(self.detokenizer.add([token])).text
            if self.num_tokens >= self.options.max_new_tokens:
                out.finish_reason = pb.FINISH_REASON_LENGTH
                out.text += self._flush()
                break
        return out


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return router_tokenizer()


def run(stream: OutputStream, ids: list[int], sizes: list[int]) -> list[tuple]:
    items, pos, n = [], 0, 0
    while pos < len(ids):
        size = sizes[n % len(sizes)]
        c = stream.commit(ids[pos : pos + size])
        items.append((c.token_ids, c.text, c.finish_reason, c.matched_stop))
        if c.finish_reason:
            break
        pos, n = pos + size, n + 1
    return items


def test_blocks_commit_as_token_by_token(tok: Tokenizer) -> None:
    rnd = random.Random(0)
    texts = WIDE + HANDMADE
    eos = sorted(tok.eos_token_ids)
    for case in range(300):
        ids = tok.encode(rnd.choice(texts) + rnd.choice(texts), add_special_tokens=False)
        if rnd.random() < 0.3:  # an EOS somewhere (or ignored)
            ids.insert(rnd.randrange(len(ids)), eos[0])
        stop_ids = frozenset(rnd.sample(ids, 1)) if rnd.random() < 0.3 else frozenset()
        options = SamplingOptions(
            max_new_tokens=rnd.choice([1, 2, 5, len(ids) // 2 + 1, 10_000]),
            stop_token_ids=stop_ids,
            ignore_eos=rnd.random() < 0.2,
        )
        sizes = [rnd.choice([1, 2, 3, 4, 6, 8, 64]) for _ in range(3)]
        got = run(OutputStream(tok, options), ids, sizes)
        assert got == run(PerToken(tok, options), ids, sizes), f"case {case}"


def test_a_block_past_the_limit_keeps_one_token(tok: Tokenizer) -> None:
    stream = OutputStream(tok, SamplingOptions(max_new_tokens=2))
    ids = tok.encode("one two three four", add_special_tokens=False)
    first = stream.commit(ids[:2])
    assert first.finish_reason == pb.FINISH_REASON_LENGTH and first.token_ids == ids[:2]
    again = stream.commit(ids[2:])  # a caller past the end still gets one token, then LENGTH
    assert again.token_ids == ids[2:3] and again.finish_reason == pb.FINISH_REASON_LENGTH
    assert stream.commit([]) == Committed([], "")
