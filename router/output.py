"""Commits sampled tokens to a request's output, applying the stop rules token by token.

A step may commit several tokens at once (speculative decoding). The rules run on each token
in order, so a stop inside an accepted block truncates it and nothing after it is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from protos import generation_pb2 as pb
from router.detokenizer import IncrementalDetokenizer
from router.request import SamplingOptions
from router.stop import StopMatcher
from router.tokenizer import Tokenizer


@dataclass
class Committed:
    token_ids: list[int]  # tokens kept from this block (a stop token id included)
    text: str
    finish_reason: pb.FinishReason = pb.FINISH_REASON_UNSPECIFIED
    matched_stop: str = ""


class OutputStream:
    def __init__(self, tokenizer: Tokenizer, options: SamplingOptions) -> None:
        self.options = options
        self.eos_ids = frozenset() if options.ignore_eos else frozenset(tokenizer.eos_token_ids)
        self._end_ids = options.stop_token_ids | self.eos_ids
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(options.stop)
        self.num_tokens = 0

    def commit(self, token_ids: Sequence[int]) -> Committed:
        if not self.stops.stop_strings:
            return self._commit_block(list(token_ids))
        out = Committed([], "")
        for token in token_ids:
            out.token_ids.append(token)
            self.num_tokens += 1
            if self._stopped_by_token(token, out):
                out.text += self._flush()
                break
            may_stop = self.num_tokens >= self.options.min_tokens  # vLLM's min_tokens
            pushed = self.stops.push(self.detokenizer.add([token]), may_stop)
            out.text += pushed.text
            if pushed.stopped:
                out.finish_reason, out.matched_stop = pb.FINISH_REASON_STOP, pushed.matched or ""
                break
            if self.num_tokens >= self.options.max_new_tokens:
                out.finish_reason = pb.FINISH_REASON_LENGTH
                out.text += self._flush()
                break
        return out

    def _commit_block(self, block: list[int]) -> Committed:
        """``commit`` without stop strings: the same cut, reason and text, but the stop rules
        on ids are found over the whole block and the text comes from one detokenizer call."""
        out = Committed([], "")
        if not block:
            return out
        room = max(1, self.options.max_new_tokens - self.num_tokens)
        end = room  # where a stop token or EOS ends the block first, if one does
        if not self._end_ids.isdisjoint(block):
            end = next(i for i, token in enumerate(block) if token in self._end_ids)
        if end < room:  # that token is kept, and is not part of the text
            out.token_ids = block[: end + 1]
            self._stopped_by_token(block[end], out)
            out.text = self.detokenizer.add_each(block[:end]) + self.detokenizer.flush()
        elif len(block) >= room:
            out.token_ids = block[:room]
            out.finish_reason = pb.FINISH_REASON_LENGTH
            out.text = self.detokenizer.add_each(out.token_ids) + self.detokenizer.flush()
        else:
            out.token_ids = block
            out.text = self.detokenizer.add_each(block)
        self.num_tokens += len(out.token_ids)
        return out

    def _stopped_by_token(self, token: int, out: Committed) -> bool:
        if token in self.options.stop_token_ids:
            out.finish_reason, out.matched_stop = pb.FINISH_REASON_STOP, str(token)
        elif token in self.eos_ids:
            out.finish_reason = pb.FINISH_REASON_EOS
        else:
            return False
        return True

    def _flush(self) -> str:
        """Held-back text at the end: an incomplete character or a partial stop string."""
        return self.stops.push(self.detokenizer.flush()).text + self.stops.flush()


def coalesce(item: pb.GenerateResponse | Exception, outbox: asyncio.Queue) -> object:
    """``item`` and the items queued behind it as one message. A stream whose writer fell
    behind (the loop busy: a burst, many streams) then costs one write, not one a step; a
    writer that keeps up sends each step's item as it comes."""
    while isinstance(item, pb.GenerateResponse) and not item.finish_reason and not outbox.empty():
        following = outbox.get_nowait()
        if not isinstance(following, pb.GenerateResponse):
            outbox.put_nowait(following)  # an error is the stream's last item: it stays last
            return item
        text = item.text + following.text
        item.MergeFrom(following)  # token ids appended; the last item's finish fields
        item.text = text
    return item


# gRPC clients refuse a message over 4 MiB unless told otherwise: no item may need more. Half
# that leaves the item's own fields room; a long prompt's scores go out ahead of the item, in
# items of their own.
MAX_ITEM_BYTES = 2 << 20
ENTRY_FRAMING_BYTES = 4  # a repeated field's tag and length in front of each entry, at most


def within_receive_limit(item: pb.GenerateResponse) -> list[pb.GenerateResponse]:
    """``item`` as items of at most ~MAX_ITEM_BYTES: a long prompt's scores (20 alternatives
    each, past ~4,800 prompt tokens) split into items that carry only scores, then ``item``
    with the rest; concatenated in order, the items' ``prompt_logprobs`` are ``item``'s."""
    if not item.prompt_logprobs or item.ByteSize() <= MAX_ITEM_BYTES:
        return [item]
    parts, start, size = [], 0, 0
    entries = list(item.prompt_logprobs)
    for i, entry in enumerate(entries):
        size += entry.ByteSize() + ENTRY_FRAMING_BYTES
        if size > MAX_ITEM_BYTES and i > start:
            parts.append(pb.GenerateResponse(request_id=item.request_id,
                                             prompt_logprobs=entries[start:i]))  # fmt: skip
            start, size = i, entry.ByteSize() + ENTRY_FRAMING_BYTES
    del item.prompt_logprobs[:start]
    return [*parts, item]
