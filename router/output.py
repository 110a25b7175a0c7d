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
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stops = StopMatcher(options.stop)
        self.num_tokens = 0

    def commit(self, token_ids: Sequence[int]) -> Committed:
        out = Committed([], "")
        for token in token_ids:
            out.token_ids.append(token)
            self.num_tokens += 1
            if self._stopped_by_token(token, out):
                out.text += self._flush()
                break
            pushed = self.stops.push(self.detokenizer.add([token]))
            out.text += pushed.text
            if pushed.stopped:
                out.finish_reason, out.matched_stop = pb.FINISH_REASON_STOP, pushed.matched or ""
                break
            if self.num_tokens >= self.options.max_new_tokens:
                out.finish_reason = pb.FINISH_REASON_LENGTH
                out.text += self._flush()
                break
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
